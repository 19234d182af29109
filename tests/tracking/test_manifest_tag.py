"""The manifest's sha256 kept outside the folder: the tag of the campaign's MLflow parent run."""

from __future__ import annotations

import pytest

from gpucampaign.tracking import mlflow as tracking
from gpucampaign.tracking.campaign import tag_manifest
from tests.helpers import digits_file, make_spec  # noqa: F401
from tests.helpers.fake_mlflow import FakeClient

pytest.importorskip("mlflow")


def test_the_manifests_sha256_is_a_tag_of_the_parent_run(
    tmp_path,
    digits_file,  # noqa: F811
    monkeypatch,
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("GPUCAMPAIGN_TRACKING", raising=False)
    fake = FakeClient()
    monkeypatch.setattr(tracking, "make_client", lambda uri: fake)
    spec = make_spec(tmp_path, digits_file, tracking={"mlflow": {"uri": "http://127.0.0.1:9"}})
    sha = "ab" * 32
    line = tag_manifest(spec, campaign_id="t-1", sha256=sha)
    assert line is not None and "gpucampaign.manifest_sha256" in line
    ((_, parent),) = fake.runs.items()
    assert parent["tags"]["gpucampaign.manifest_sha256"] == sha
    fake.down = True
    assert "not tagged" in (tag_manifest(spec, campaign_id="t-1", sha256=sha) or "")
    assert tag_manifest(make_spec(tmp_path, digits_file), campaign_id="t-1", sha256=sha) is None
