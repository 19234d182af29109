"""The spool: checkpoints keep being saved while the remote store is down, and go up later."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.checkpoint.state import capture_rng
from gpucampaign.folder.layout import CHECKPOINT_LATEST, checkpoint_step_dir
from gpucampaign.storage import LocalStore, StorageError, spooled_keys
from gpucampaign.storage.mirror import mirror_output
from gpucampaign.storage.spool import SpoolingStore
from gpucampaign.storage.status import campaign_status

RUN = "control-0123456789"
CFG = "ab" * 32


class FlakyStore(LocalStore):
    """A local folder standing in for a remote store that can be switched off."""

    down = False
    refuse: tuple[str, ...] = ()

    def _gate(self, key: str = "") -> None:
        if self.down or any(r in key for r in self.refuse):
            raise StorageError(f"cannot reach the S3 endpoint for {key!r}")

    def put_file(self, key: str, *, src: Path, sha256: str | None = None) -> None:
        self._gate(key)
        super().put_file(key, src=src)

    def write_bytes(self, key: str, *, data: bytes) -> None:
        self._gate(key)
        super().write_bytes(key, data=data)

    def list(self, prefix: str = "") -> list[str]:
        self._gate()
        return super().list(prefix)

    def delete(self, key: str) -> None:
        self._gate(key)
        super().delete(key)

    def local_path(self, key: str) -> Path | None:
        return None


def _save(store, step: int) -> None:
    model = {"w": torch.full((4, 2), float(step))}
    state = {
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "scaler": {},
        "rng": capture_rng(),
        "counters": {"global_step": step},
        "cursor": {
            "epoch": 0,
            "batch_in_epoch": step,
            "epoch_generator_state": torch.Generator().get_state(),
        },
    }
    CheckpointManager(store, run_id=RUN, config_sha256=CFG, keep=2).save(
        step, model_state=model, train_state=state
    )


def _latest_step(store) -> int | None:
    loaded, _ = CheckpointManager(store, run_id=RUN, config_sha256=CFG).load_latest()
    return None if loaded is None else loaded.step


def test_saves_go_on_while_the_remote_is_down_and_the_spool_drains(tmp_path: Path) -> None:
    remote = FlakyStore(tmp_path / "bucket")
    out = tmp_path / "out"
    store = SpoolingStore(remote, spool_dir=out / "spool", retry_s=0.05, max_retry_s=0.2)
    _save(store, 2)
    assert store.pending() == [] and _latest_step(remote) == 2
    remote.down = True
    _save(store, 4)
    _save(store, 6)  # the prune of step 2 cannot reach the remote: nothing breaks
    assert _latest_step(store) == 6  # the spool serves the newest checkpoint
    assert f"{RUN}/{CHECKPOINT_LATEST}" in store.pending() and store.last_error
    assert spooled_keys(out) == store.pending()
    remote.down = False
    deadline = time.monotonic() + 20
    while store.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.pending() == []
    assert _latest_step(remote) == 6  # everything is up, LATEST last
    for step in (4, 6):
        assert remote.exists(f"{RUN}/{checkpoint_step_dir(step)}/meta.json")


def test_latest_waits_for_the_files_it_names(tmp_path: Path) -> None:
    remote = FlakyStore(tmp_path / "bucket")
    store = SpoolingStore(remote, spool_dir=tmp_path / "spool", retry_s=10)
    remote.down = True
    _save(store, 3)
    # state.pt refused before the store answers: the spool's own thread, woken by the save,
    # may drain at any moment from here on, and it must meet the same refusal (the CI saw it
    # drain first under load, so which call moved the files is not the test's to assert).
    remote.refuse = ("state.pt",)
    remote.down = False
    store.drain_once()  # serialized with the thread's: after it, the round has been tried
    step_dir = f"{RUN}/{checkpoint_step_dir(3)}"
    assert remote.exists(f"{step_dir}/model.safetensors")  # the files before it went up ...
    assert not remote.exists(f"{step_dir}/state.pt")
    assert f"{step_dir}/state.pt" in store.pending()
    assert not remote.exists(
        f"{RUN}/{CHECKPOINT_LATEST}"
    )  # ... but not a LATEST naming a missing one
    remote.refuse = ()
    assert store.drain(timeout_s=5) == []
    assert json.loads(remote.read_bytes(f"{RUN}/{CHECKPOINT_LATEST}"))["step"] == 3


def test_nothing_spooled_is_deleted_before_its_upload(tmp_path: Path) -> None:
    remote = RecordingStore(tmp_path / "bucket")
    store = SpoolingStore(remote, spool_dir=tmp_path / "spool", retry_s=10)
    remote.down = True
    store.write_bytes("a/b.bin", data=b"only here")
    store.delete("a/b.bin")
    assert store.pending() == ["a/b.bin"] and store.waiting_deletes() == ["a/b.bin"]
    remote.down = False
    assert store.drain(timeout_s=5) == [] and store.waiting_deletes() == []
    # It went up (verified), and only then was the delete asked for applied.
    assert remote.calls == [("write", "a/b.bin"), ("delete", "a/b.bin")]
    assert not remote.exists("a/b.bin")


class RecordingStore(FlakyStore):
    """A flaky remote that records every write and delete it took, in order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: list[tuple[str, str]] = []

    def put_file(self, key: str, *, src: Path, sha256: str | None = None) -> None:
        super().put_file(key, src=src)
        self.calls.append(("write", key))

    def write_bytes(self, key: str, *, data: bytes) -> None:
        super().write_bytes(key, data=data)
        self.calls.append(("write", key))

    def delete(self, key: str) -> None:
        super().delete(key)
        self.calls.append(("delete", key))


def _steps_in(store: LocalStore) -> list[int]:
    return sorted({int(k.split("/")[1][5:]) for k in store.list(RUN) if "/step-" in f"/{k}"})


def test_the_spool_drains_in_order_and_keep_applies_after_draining(tmp_path: Path) -> None:
    """An outage over many saves of a run that keeps 2: once the remote is back the spool goes
    up checkpoint by checkpoint (payload, then meta, then LATEST), and the bucket ends with the
    2 checkpoints ``keep`` says, not every one saved meanwhile."""
    remote = RecordingStore(tmp_path / "bucket")
    store = SpoolingStore(remote, spool_dir=tmp_path / "spool", retry_s=10)
    _save(store, 2)
    _save(store, 4)
    assert _steps_in(remote) == [2, 4]
    remote.down = True
    for step in range(6, 26, 2):  # ten saves while the remote is down
        _save(store, step)
    assert _latest_step(store) == 24
    remote.down = False
    remote.calls.clear()
    assert store.drain(timeout_s=10) == [] and store.waiting_deletes() == []

    assert _steps_in(remote) == [22, 24]  # keep=2, after draining
    assert _latest_step(remote) == 24
    writes = [k for op, k in remote.calls if op == "write"]
    deletes = [k for op, k in remote.calls if op == "delete"]
    assert remote.calls == [("write", k) for k in writes] + [("delete", k) for k in deletes]
    assert writes[-1] == f"{RUN}/{CHECKPOINT_LATEST}"
    folders = [k.split("/")[1] for k in writes[:-1]]
    assert folders == sorted(folders)  # oldest checkpoint first
    for folder in set(folders):
        names = [k.rsplit("/", 1)[1] for k in writes if f"/{folder}/" in k]
        assert names[-1] == "meta.json" and len(names) == 3  # the payload before its meta
    assert {k.split("/")[1] for k in deletes} == {checkpoint_step_dir(s) for s in range(2, 22, 2)}


def test_status_and_close_say_what_is_not_off_the_machine(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "spec.yaml").write_text(
        "name: t\npackages: [{gpu: rtx4090, days: 3}]\n"
        "calendar: [{name: prep, kind: human, hours: 1}]\n"
        "storage: {url: 's3://bucket/camp'}\n"
    )
    LocalStore(out / "spool").write_bytes(f"{RUN}/{CHECKPOINT_LATEST}", data=b"{}")
    st = campaign_status(out, store=LocalStore(tmp_path / "bucket"))
    assert st["checkpoints"]["only_local"] == [f"{RUN}/{CHECKPOINT_LATEST}"] and not st["safe"]
    assert "spool/" not in " ".join(st["outputs"]["only_local"])
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "very-secret-value",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }  # nothing listens
    done = mirror_output(out, url="s3://bucket/camp", env=env, drain_s=0)
    assert done["spooled"] == [f"{RUN}/{CHECKPOINT_LATEST}"] and "very-secret" not in done["error"]
    assert (out / "spool" / RUN / CHECKPOINT_LATEST).is_file()
