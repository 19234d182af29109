"""Student's t quantiles without scipy: the plan's and the verdict's, held to scipy's."""

from __future__ import annotations

import pytest

from gpucampaign.core.tdist import t_quantile


@pytest.mark.parametrize("p", [0.6, 0.80, 0.975, 0.995])
def test_the_t_quantile_is_scipys_at_every_dof_a_spec_allows(p: float) -> None:
    """The project's t quantile (the plan's, before the first step, and the verdict's) equals
    scipy's, from one degree of freedom (two seeds, the closed form's odd branch at its
    shortest) to the 999 that ``MAX_SEEDS`` allows."""
    from scipy.stats import t

    for dof in [*range(1, 121), 255, 256, 998, 999]:
        assert t_quantile(p, dof=dof) == pytest.approx(t.ppf(p, dof), rel=1e-11), dof
    with pytest.raises(ValueError, match="0.5 < p < 1"):
        t_quantile(0.4, dof=3)
    with pytest.raises(ValueError, match="dof >= 1"):
        t_quantile(0.9, dof=0)


def test_the_verdicts_seed_interval_is_the_one_scipys_quantile_gives() -> None:
    """The half-width over seeds and examples (``close.bootstrap``) with scipy's quantile, as
    it was computed before it used the project's own."""
    import math

    from scipy.stats import t

    from gpucampaign.close.bootstrap import _t_half_width

    for dof in range(1, 40):
        for seed_var, example_var in ((0.01, 0.0004), (2.5e-5, 1e-6), (0.0, 0.003)):
            q = float(t.ppf(0.975, dof))
            want = math.sqrt(q * q * seed_var + 1.959963984540054**2 * example_var)
            got = _t_half_width(seed_var=seed_var, example_var=example_var, dof=dof)
            assert got == pytest.approx(want, rel=1e-12), (dof, seed_var)
