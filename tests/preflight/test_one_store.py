"""Several machines need one store they all reach (issue 44): a deployment's run of a spec of
several lots with a local store is refused before anything is written; one lot, an ``s3://``
store or ``campaign run`` (lanes of one process) go on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpucampaign.config import CampaignSpec, SpecError, load_spec
from gpucampaign.plan import calendar
from gpucampaign.preflight.machines import refuse_machines_without_store
from tests.helpers.specs import TRAIN_CONTROL, one_lot_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _with_store(cs: CampaignSpec, url: str) -> CampaignSpec:
    return cs.model_copy(update={"storage": cs.storage.model_copy(update={"url": url})})


def _refuse(cs: CampaignSpec, *, deployment: bool) -> None:
    refuse_machines_without_store(cs, machines=calendar.plan(cs).machines, deployment=deployment)


def test_a_deployments_run_of_two_lots_with_a_local_store_is_refused_with_the_fix() -> None:
    cs = load_spec(EXAMPLES / "two-lots.yaml")
    assert cs.storage.url == "local"
    with pytest.raises(SpecError) as caught:
        _refuse(cs, deployment=True)
    text = str(caught.value)
    assert caught.value.field == "storage.url"
    assert text.startswith("field 'storage.url': the spec plans 2 machines (lot 1, lot 2)")
    assert "'local'" in text and "nothing was written or started" in text
    assert "`storage.url: s3://BUCKET/PREFIX`" in text and "`count: 1`" in text
    assert "`campaign run`" in text and "\n" not in text  # one paragraph


def test_one_lot_an_s3_store_or_campaign_run_go_on() -> None:
    two = load_spec(EXAMPLES / "two-lots.yaml")
    _refuse(one_lot_spec(TRAIN_CONTROL), deployment=True)  # one lot, local, a deployment's
    _refuse(_with_store(two, "s3://bucket/two-lots"), deployment=True)  # several lots, s3
    _refuse(two, deployment=False)  # several lots, local, `campaign run`: one process


def test_dated_lots_one_after_another_go_on_with_a_local_store() -> None:
    """Dated lots are the lot-end hand-over's: one machine at a time, any store (the fresh-clone
    CI's lot-end campaigns were refused so)."""
    two = load_spec(EXAMPLES / "two-lots.yaml")
    first = datetime(2026, 12, 1, tzinfo=UTC)
    lots = [
        two.packages[0].model_copy(update={"count": 1, "starts_at": first + timedelta(days=d)})
        for d in (0, 3)
    ]
    dated = CampaignSpec.model_validate({**two.model_dump(), "packages": lots})
    assert dated.storage.url == "local" and len(calendar.plan(dated).machines) == 2
    _refuse(dated, deployment=True)
