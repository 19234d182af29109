"""Student's t quantiles without scipy: the plan's and the verdict's, held to scipy's."""

from __future__ import annotations

import pytest

from gpucampaign.core.tdist import t_power, t_quantile, t_upper


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


def test_the_verdicts_tail_and_power_are_scipys() -> None:
    """The one-sided p-value (``t_upper``, Holm's input) and the noncentral t's power
    (``t_power``, the plan's detectable gain) agree with scipy's."""
    from scipy.stats import nct, t

    for dof in (1, 2, 3, 5, 9, 30, 200, 1000):
        for x in (-3.0, -0.4, 0.0, 0.7, 2.2, 6.0):
            assert t_upper(x, dof=dof) == pytest.approx(float(t.sf(x, dof)), abs=1e-12)
        crit = float(t.ppf(0.9875, dof))
        for shift in (0.0, 1.0, 3.0, 7.0):
            want = float(nct.sf(crit, dof, shift))
            assert t_power(shift, dof=dof, critical=crit) == pytest.approx(want, abs=1e-6)
