"""One entry: ``campaign run`` parses its spec once and preflights it once. The CLI opens the
campaign (``open_campaign``) and hands the flow the opened value; the flow opens only raw input
(a deployment's ``spec`` and ``out``), never what the CLI opened.

The run goes in this process on the test server, up to the flow's first phase (the data audit),
where it stops: everything that reads or checks the spec happens before it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from typer.testing import CliRunner

import gpucampaign.cli.runner as runner
import gpucampaign.preflight.checks as checks
from gpucampaign.cli.commands import app
from gpucampaign.config import CampaignSpec

if TYPE_CHECKING:
    from gpucampaign.preflight import OpenCampaign

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits" / "campaign.yaml"


class _AuditReached(Exception):
    """The flow got to its first phase: the spec was opened by then."""


class _Audit:
    """The data audit's stand-in: records what the flow submitted, then ends the run."""

    def __init__(self) -> None:
        self.specs: list[Any] = []

    def submit(self, spec: Any, **kw: Any) -> Any:
        self.specs.append(spec)
        raise _AuditReached()


def test_campaign_run_parses_and_preflights_its_spec_once(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpucampaign_prefect.flows import campaign as flow_module

    parsed: list[str] = []
    real_validate = CampaignSpec.model_validate.__func__

    def counted_validate(cls: type[CampaignSpec], data: Any, **kw: Any) -> CampaignSpec:
        parsed.append(data.get("name") if isinstance(data, dict) else "?")
        return real_validate(cls, data, **kw)

    preflighted: list[str] = []
    real_check_storage = checks.check_storage

    def counted_check_storage(url: str, **kw: Any) -> None:  # the preflight's store check
        preflighted.append(url)
        real_check_storage(url, **kw)

    monkeypatch.setattr(CampaignSpec, "model_validate", classmethod(counted_validate))
    monkeypatch.setattr(checks, "check_storage", counted_check_storage)
    # On the test server: no embedded server of its own, no signal handlers of its own.
    monkeypatch.setattr(runner, "start_server_early", lambda: None)
    monkeypatch.setattr(runner, "interruptible_run", lambda **kw: contextlib.nullcontext())
    audit = _Audit()
    monkeypatch.setattr(flow_module, "data_audit", audit)

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(DIGITS), "--out", str(out)])

    assert audit.specs, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, _AuditReached), result.exception
    assert parsed == ["digits"]  # one parse, by the CLI
    assert preflighted == ["local"]  # one preflight, by the CLI
    # The flow ran on what the CLI checked: the same spec object, its folder written once.
    assert (out / "spec.yaml").read_bytes() == DIGITS.read_bytes()
    assert all(isinstance(s, CampaignSpec) for s in audit.specs)


def test_the_flow_opens_raw_input_itself(
    prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment's parameters are raw (``spec``, ``out``): the flow opens them, once."""
    from gpucampaign_prefect.flows import campaign as flow_module

    opened: list[OpenCampaign] = []
    real_open = flow_module.open_campaign

    def counted_open(*args: Any, **kw: Any) -> OpenCampaign:
        opened.append(real_open(*args, **kw))
        return opened[-1]

    monkeypatch.setattr(flow_module, "open_campaign", counted_open)
    audit = _Audit()
    monkeypatch.setattr(flow_module, "data_audit", audit)
    out = tmp_path / "out"
    state = flow_module.campaign(spec=str(DIGITS), out=str(out), return_state=True)
    assert state.is_failed() and len(opened) == 1
    assert audit.specs == [opened[0].spec]
