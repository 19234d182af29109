"""campaign status: time left on the rental, what the store holds, what is only local."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.config import load_spec
from gpucampaign.folder.layout import SPOOL_DIR
from gpucampaign.storage import LocalStore
from gpucampaign.storage.mirror import mirror_folder
from gpucampaign.storage.status import (
    RentalEnding,
    campaign_status,
    check_rental_margin,
    folder_to_check,
)
from tests.helpers import SPEC_TEMPLATE

NOW = datetime(2026, 3, 3, 9, 0, tzinfo=UTC)


def _folder(root: Path, *, storage: str, starts_at: str | None) -> Path:
    text = SPEC_TEMPLATE.format(sha="0" * 64, threshold=0.2, unit="null")
    lot = "{gpu: rtx4090, days: 3, count: 1}"
    if starts_at:
        text = text.replace(lot, f"{{gpu: rtx4090, days: 3, count: 1, starts_at: '{starts_at}'}}")
    text += f"storage: {{url: '{storage}'}}\n"
    root.mkdir(parents=True)
    (root / "spec.yaml").write_text(text)
    (root / "runs" / "r1").mkdir(parents=True)
    (root / "runs" / "r1" / "params.json").write_text('{"lr": 0.1}\n')
    return root


def test_local_storage_everything_is_only_local(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", storage="local", starts_at="2026-03-02T09:00:00Z")
    LocalStore(out / "checkpoints").write_bytes("ctl/LATEST", data=b"{}")
    st = campaign_status(out, now=NOW)
    assert st["ends_at"] == "2026-03-05T09:00:00Z" and st["hours_left"] == 48.0
    assert st["time_left"] == "2 d 0 h"
    assert st["checkpoints"] == {"in_store": [], "only_local": ["ctl/LATEST"]}
    assert "spec.yaml" in st["outputs"]["only_local"] and not st["outputs"]["in_store"]
    assert st["retrieve"] is None and st["safe"] is False


def test_s3_storage_compares_with_the_store_and_the_spool(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", storage="s3://bucket/camp", starts_at=None)
    rid = load_spec(out / "spec.yaml").resolve_run("control").run_id
    bucket = LocalStore(tmp_path / "bucket")
    bucket.write_bytes(f"{rid}/step-000000002/meta.json", data=b"{}")
    mirror_folder(out, store=bucket)
    st = campaign_status(out, now=NOW, store=bucket)
    assert st["time_left"] == "unknown" and st["ends_at"] is None
    assert st["checkpoints"]["in_store"] == [f"{rid}/step-000000002/meta.json"]
    assert st["outputs"]["only_local"] == [] and st["safe"] is True
    assert st["retrieve"] == "campaign retrieve s3://bucket/camp --to DIR"

    (out / "runs" / "r1" / "params.json").write_text('{"lr": 0.2}\n')  # changed since the mirror
    LocalStore(out / SPOOL_DIR).write_bytes(f"{rid}/step-000000004/meta.json", data=b"{}")
    st = campaign_status(out, now=NOW, store=bucket)
    assert st["outputs"]["only_local"] == ["runs/r1/params.json"]
    assert st["checkpoints"]["only_local"] == [f"{rid}/step-000000004/meta.json"]
    assert st["safe"] is False


def test_cli_status_json_and_not_a_campaign_folder(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", storage="local", starts_at="2026-03-02T09:00:00Z")
    res = CliRunner().invoke(app, ["status", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ends_at"] == "2026-03-05T09:00:00Z"
    res = CliRunner().invoke(app, ["status", str(out)])
    assert res.exit_code == 0 and "only on this machine" in res.stdout
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["status", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "not a campaign output folder" in res.output


def test_the_margin_fails_loudly_only_when_something_is_only_local(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", storage="s3://bucket/camp", starts_at="2026-03-02T09:00:00Z")
    bucket = LocalStore(tmp_path / "bucket")
    late = datetime(2026, 3, 5, 0, 0, tzinfo=UTC)  # 9 h before the end
    with pytest.raises(RentalEnding, match=r"9\.0 h left, under the 12 h margin") as err:
        check_rental_margin(out, now=late, store=bucket)
    assert "campaign retrieve s3://bucket/camp --to DIR" in str(err.value)
    assert check_rental_margin(out, now=NOW, store=bucket)["hours_left"] == 48.0
    assert check_rental_margin(out, now=late, store=bucket, margin_hours=6)["safe"] is False
    mirror_folder(out, store=bucket)
    assert check_rental_margin(out, now=late, store=bucket)["safe"] is True


def test_the_scheduled_check_reads_a_fresh_copy_from_the_store(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", storage="s3://bucket/camp", starts_at=None)
    bucket = LocalStore(tmp_path / "bucket")
    assert folder_to_check(out, dest=tmp_path / "fresh", store=bucket) == out  # no mirror yet
    mirror_folder(out, store=bucket)
    got = folder_to_check(out, dest=tmp_path / "fresh", store=bucket)
    assert got == tmp_path / "fresh"
    assert (got / "runs" / "r1" / "params.json").read_text() == '{"lr": 0.1}\n'
    local = _folder(tmp_path / "local", storage="local", starts_at=None)
    assert folder_to_check(local, dest=tmp_path / "fresh2") == local


def test_status_of_an_unclosed_user_recipe_campaign_from_another_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe module sits next to the user's spec, not on any path of this process (and
    not in the folder, which is unclosed): status reads the folder and the store alone."""
    import uuid

    from gpucampaign.folder.layout import LOCK_FILE

    module = f"user_recipe_{uuid.uuid4().hex[:8]}"  # importable from nowhere here
    text = SPEC_TEMPLATE.format(sha="0" * 64, threshold=0.2, unit="null")
    text = text.replace("recipe: mlp", f"recipe: '{module}:Regress'")
    assert module in text
    out = tmp_path / "out"
    out.mkdir()
    (out / "spec.yaml").write_text(text + "storage: {url: 's3://bucket/camp'}\n")
    (out / LOCK_FILE).write_text("")
    (out / "runs" / "control-0123456789").mkdir(parents=True)
    bucket = LocalStore(tmp_path / "bucket")
    bucket.write_bytes("control-0123456789/step-000000002/meta.json", data=b"{}")
    bucket.write_bytes("control-0123456789/LATEST", data=b"{}")
    LocalStore(out / SPOOL_DIR).write_bytes(
        "control-0123456789/step-000000004/meta.json", data=b"{}"
    )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    st = campaign_status(out, now=NOW, store=bucket)
    assert st["checkpoints"] == {
        "in_store": ["control-0123456789/LATEST", "control-0123456789/step-000000002/meta.json"],
        "only_local": ["control-0123456789/step-000000004/meta.json"],
    }
    assert st["outputs"]["only_local"] == ["spec.yaml"] and st["safe"] is False

    # Closed and fully mirrored, the writer's empty lock still there: all is off the machine.
    LocalStore(out / SPOOL_DIR).delete("control-0123456789/step-000000004/meta.json")
    mirror_folder(out, store=bucket)
    st = campaign_status(out, now=NOW, store=bucket)
    assert st["outputs"] == {"in_store": ["spec.yaml"], "only_local": []}
    assert st["checkpoints"]["only_local"] == [] and len(st["checkpoints"]["in_store"]) == 2
    assert st["safe"] is True
    # The mirror's own keys (runs/..., spec.yaml) are not counted as checkpoints.
    assert not any(k.startswith("runs/") for k in st["checkpoints"]["in_store"])


def test_cli_status_of_a_user_recipe_folder_says_everything_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    from gpucampaign.folder.layout import LOCK_FILE

    module = f"user_recipe_{uuid.uuid4().hex[:8]}"
    text = SPEC_TEMPLATE.format(sha="0" * 64, threshold=0.2, unit="null")
    out = tmp_path / "out"
    out.mkdir()
    (out / "spec.yaml").write_text(
        text.replace("recipe: mlp", f"recipe: '{module}:Regress'") + "storage: {url: local}\n"
    )
    (out / LOCK_FILE).write_text("")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["status", str(out)])
    assert res.exit_code == 0, res.output
    assert "only local: .lock" not in res.stdout and "only local: spec.yaml" in res.stdout
