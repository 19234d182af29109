"""The bounded restart check: the live run's early save, resumed in a fresh process."""

from __future__ import annotations

import io
import json

import pytest
import torch

from gpucampaign.checkpoint.tensorfiles import serialize_state
from gpucampaign.core.files import sha256_bytes
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.folder.layout import CHECKPOINT_STATE, checkpoint_step_dir
from gpucampaign.restartcheck.earlysave import campaign_restart_check, verify_early_save
from gpucampaign.restartcheck.scheduled import _copy_checkpoint
from gpucampaign.restartcheck.target import RestartTarget
from gpucampaign.storage import LocalStore
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401

# Every check here resumes a save in a fresh process.
pytestmark = pytest.mark.process


def _live_run(tmp_path, digits_file):  # noqa: F811
    """A finished control with dropout: saves at 5 (the early save, mid-epoch), 7, 14, 20."""
    spec = make_spec(
        tmp_path, digits_file, control={"dropout": 0.1}, checkpoint={"keep": 4, "every_steps": 7}
    )
    assert run(spec, tmp_path, stop_after_steps=5).completed is False  # the pilot's save
    assert run(spec, tmp_path).completed
    return spec


def _check(spec, tmp_path, work="work", **kw):
    target = RestartTarget(
        spec=spec,
        run=spec.resolve_run("control"),
        corpus_path=tmp_path / "data" / "digits.csv",
        store=LocalStore(tmp_path / "out" / "checkpoints"),
        run_dir=run_dir(spec, tmp_path),
        workdir=tmp_path / work,
    )
    return verify_early_save(target, **kw)


def test_early_save_replays_to_the_next_save_exactly(tmp_path, digits_file):  # noqa: F811
    spec = _live_run(tmp_path, digits_file)
    report = _check(spec, tmp_path)
    assert report.identical and report.mode == "early-save" and report.max_abs_diff == 0.0
    assert (report.k, report.n, report.compared_steps) == (5, 7, 2) and report.k_mid_epoch
    assert {"params", "optimizer", "rng", "cursor", "counters"} <= set(report.compared)
    capped = _check(spec, tmp_path, work="w2", max_steps=1)
    assert capped.identical and (capped.k, capped.n) == (5, 6)
    assert "params" not in capped.compared  # nothing the live run recorded at step 6
    # The save the fresh process resumed is linked from the live store, not copied.
    key = f"{spec.resolve_run('control').run_id}/{checkpoint_step_dir(5)}/{CHECKPOINT_STATE}"
    live = LocalStore(tmp_path / "out" / "checkpoints").local_path(key)
    assert live is not None and (tmp_path / "work" / "checkpoints" / key).samefile(live)


def test_a_run_resumed_into_a_fresh_folder_is_checked_from_a_save_it_trained_after(
    tmp_path,
    digits_file,  # noqa: F811
):
    # Another host resumed the run from its save of step 7: its folder recorded steps 8..20 only.
    spec = _live_run(tmp_path, digits_file)
    metrics = run_dir(spec, tmp_path) / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    kept = [r for r in rows if r.get("kind") != "train" or r["step"] > 7]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in kept))
    report = _check(spec, tmp_path)
    assert report.identical and (report.k, report.n) == (7, 14)


class _RemoteLike(LocalStore):
    """A store whose objects are not files here (as S3's): nothing to link."""

    def local_path(self, key):
        return None


def test_a_store_that_is_not_a_folder_is_copied_for_the_check(tmp_path, digits_file):  # noqa: F811
    store = LocalStore(tmp_path / "store")
    D = checkpoint_step_dir(5)  # noqa: N806
    store.write_bytes(f"r/{D}/model.safetensors", data=b"weights")
    store.write_bytes(f"r/{D}/state.pt", data=b"state")
    store.write_bytes(f"r/{D}/meta.json", data=b"{}")
    linked = _copy_checkpoint(store, run_id="r", step=5, dst=tmp_path / "a")
    copied = _copy_checkpoint(_RemoteLike(store.root), run_id="r", step=5, dst=tmp_path / "b")
    for name in ("model.safetensors", "state.pt", "meta.json"):
        key = f"r/{D}/{name}"
        src = store.local_path(key)
        assert src is not None
        assert (linked.root / key).samefile(src)
        assert not (copied.root / key).samefile(src)
        assert (copied.root / key).read_bytes() == src.read_bytes()
    assert json.loads(linked.read_bytes("r/LATEST"))["step"] == 5


def _tamper(spec, tmp_path, step, change):
    """Rewrite the train state of the checkpoint of ``step`` (and its meta's hash, so that
    the checkpoint still loads): a save that wrote the wrong state."""
    folder = (
        tmp_path
        / "out"
        / "checkpoints"
        / spec.resolve_run("control").run_id
        / checkpoint_step_dir(step)
    )
    state = torch.load(io.BytesIO((folder / CHECKPOINT_STATE).read_bytes()), weights_only=True)
    change(state)
    data = bytes(serialize_state(state))
    (folder / CHECKPOINT_STATE).write_bytes(data)
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"][CHECKPOINT_STATE] = {"sha256": sha256_bytes(data), "bytes": len(data)}
    (folder / "meta.json").write_text(json.dumps(meta))


def _drop_optimizer_state(state):
    state["optimizer"]["state"] = {}


def _cursor_off_by_one(state):
    state["cursor"]["batch_in_epoch"] += 1


def _reseeded_rng(state):
    torch.manual_seed(1234)
    state["rng"]["torch"] = torch.get_rng_state()


@pytest.mark.parametrize("change", [_drop_optimizer_state, _cursor_off_by_one, _reseeded_rng])
def test_early_save_check_catches_a_broken_resume(tmp_path, digits_file, change):  # noqa: F811
    spec = _live_run(tmp_path, digits_file)
    _tamper(spec, tmp_path, 5, change)
    with pytest.raises(NoUsableRestart, match="does not reproduce the live run") as exc:
        _check(spec, tmp_path)
    assert exc.value.step == 5
    report = _check(spec, tmp_path, work="w2", check=False)
    assert not report.identical and report.max_abs_diff > 0


def test_campaign_check_falls_back_to_three_processes(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, checkpoint={"keep": 1})
    assert run(spec, tmp_path).completed  # only the final checkpoint is kept
    report = campaign_restart_check(
        spec,
        run=spec.resolve_run("control"),
        base_dir=tmp_path,
        out=tmp_path / "out",
        workdir=tmp_path / "work",
    )
    assert report.identical and report.mode == "fresh"
