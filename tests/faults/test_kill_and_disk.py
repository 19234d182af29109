"""Faults: SIGKILL at chosen points (inside a checkpoint write, between the write and LATEST,
during pruning, during a restore), a disk that fills up during a save, and a corpus that is
not the pinned one. After each: LATEST never names a broken checkpoint, the rerun resumes
from the last good one, and the final parameters equal an uninterrupted run's bit for bit."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gpucampaign.checkpoint import tensorfiles
from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import CampaignSpec, SpecError, parse_spec
from gpucampaign.core.stoprules import EssentialInputMissing
from gpucampaign.data.corpus import load_corpus
from gpucampaign.data.tables import write_digits_corpus
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.recipe.audit import audit_corpus
from gpucampaign.storage import LocalStore, StorageError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# 1259 train rows at batch 128: 10 steps an epoch, 30 steps, a save every 4, two kept.
SPEC: dict[str, Any] = {
    "name": "faults",
    "packages": [{"gpu": "rtx4090", "days": 3}],
    "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
    "control": {
        "recipe": "mlp",
        "hidden": [16],
        "batch_size": 128,
        "epochs": 3,
        "lr": 0.01,
        "threads": 1,
        "scheduler": "cosine",
    },
    "decision_rule": {"metric": "accuracy", "threshold": 0.0},
    "checkpoint": {"every_steps": 4, "keep": 2},
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("digits") / "digits.csv"
    return path, write_digits_corpus(path)


def campaign(base: Path, digits: tuple[Path, str]) -> CampaignSpec:
    """The spec written as ``base/spec.json`` with the corpus beside it."""
    src, sha = digits
    (base / "data").mkdir(parents=True, exist_ok=True)
    (base / "data" / "digits.csv").write_bytes(src.read_bytes())
    data = {**SPEC, "corpus": {"path": "data/digits.csv", "sha256": sha}}
    (base / "spec.json").write_text(json.dumps(data))
    return parse_spec(data)


def train(spec: CampaignSpec, base: Path, **kw: Any):
    """The control run in this process, in the layout the child uses."""
    corpus = load_corpus(base / spec.corpus.path, corpus_spec=spec.corpus)
    return train_run(
        spec,
        run=spec.resolve_run("control"),
        corpus=corpus,
        store=LocalStore(base / "out" / "checkpoints"),
        run_folder=RunFolder.of(base / "out", spec.resolve_run("control").run_id),
        **kw,
    )


def run_folder(spec: CampaignSpec, base: Path) -> Path:
    return base / "out" / "runs" / spec.resolve_run("control").run_id


def manager(spec: CampaignSpec, base: Path) -> CheckpointManager:
    params = json.loads((run_folder(spec, base) / "params.json").read_text())
    return CheckpointManager(
        LocalStore(base / "out" / "checkpoints"),
        run_id=spec.resolve_run("control").run_id,
        config_sha256=params["config_sha256"],
        keep=2,
    )


def latest_is_good(spec: CampaignSpec, base: Path) -> int | None:
    """The step LATEST names, after checking that it loads with every hash; None without one."""
    m = manager(spec, base)
    ptr = m.latest_pointer()
    if ptr is None:
        return None
    m.load(int(ptr["step"]), meta_sha256=ptr["meta_sha256"])  # raises CheckpointInvalid if broken
    return int(ptr["step"])


def weights(spec: CampaignSpec, base: Path) -> dict[str, torch.Tensor]:
    return load_file(run_folder(spec, base) / "model" / "model.safetensors")


def train_losses(spec: CampaignSpec, base: Path) -> list[tuple[int, float]]:
    rows = read_metrics(run_folder(spec, base) / "metrics.jsonl")
    return [(r["step"], r["loss"]) for r in rows if r["kind"] == "train"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, digits) -> tuple[dict[str, torch.Tensor], list]:
    """Weights and losses of the uninterrupted run."""
    base = tmp_path_factory.mktemp("reference")
    spec = campaign(base, digits)
    res = train(spec, base)
    assert res.completed and res.steps_done == 30 and res.resumed_from_step is None
    return weights(spec, base), train_losses(spec, base)


def same_as_reference(spec: CampaignSpec, base: Path, reference) -> None:
    ref_weights, ref_losses = reference
    got = weights(spec, base)
    assert got.keys() == ref_weights.keys()
    assert all(torch.equal(got[k], ref_weights[k]) for k in got), "final parameters differ"
    assert train_losses(spec, base) == ref_losses


def kill_child(base: Path, point: str, n: int, faults) -> None:
    """Run the child with ``FAULT_KILL=point:n``; it must die of SIGKILL."""
    env = {
        **os.environ,
        "FAULT_KILL": f"{point}:{n}",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])
        ),
    }
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "helpers" / "killrun.py"), str(base)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, (
        point,
        n,
        proc.returncode,
        proc.stdout,
        proc.stderr[-2000:],
    )
    faults.sent("SIGKILL")
    faults.add("kill_points_tried")


# Points and the call at which the child dies: a mid-epoch step; half a buffer inside the
# second save's model or state file (the fifth checkpoint file; the two are written at once);
# the second save's folder committed but not LATEST; LATEST's temp file before its rename; the
# first delete of an old checkpoint (third save, keep 2).
KILL_POINTS = [
    ("train-step", 7),
    ("inside-write", 5),
    ("after-rename", 2),
    ("inside-latest", 2),
    ("prune", 1),
]


def check_where_it_died(spec: CampaignSpec, base: Path, point: str, latest: int) -> None:
    """The kill left what that point leaves: it died where it was meant to."""
    folder = base / "out" / "checkpoints" / spec.resolve_run("control").run_id
    names = sorted(p.name for p in folder.iterdir())
    steps = [int(n.removeprefix("step-")) for n in names if n.startswith("step-")]
    if point == "train-step":
        assert latest == 4 and train_losses(spec, base)[-1][0] == 6, names
    elif point == "inside-write":
        assert any(n.startswith(".tmp-step-") for n in names), names
    elif point == "after-rename":
        assert max(steps) > latest, names
    elif point == "inside-latest":
        assert any(n.startswith(".tmp-LATEST") for n in names) and max(steps) > latest, names
    elif point == "prune":
        files = ("meta.json", "model.safetensors", "state.pt")
        broken = [
            s for s in steps if not all((folder / f"step-{s:09d}" / f).is_file() for f in files)
        ]
        assert broken and min(broken) < latest, names


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize(("point", "n"), KILL_POINTS, ids=[p for p, _ in KILL_POINTS])
def test_sigkill_then_rerun_resumes_and_matches(tmp_path, digits, reference, faults, point, n):
    spec = campaign(tmp_path, digits)
    kill_child(tmp_path, point, n, faults)
    good = latest_is_good(spec, tmp_path)
    assert good is not None, "every kill point comes after the first save"
    check_where_it_died(spec, tmp_path, point, good)
    res = train(spec, tmp_path)
    assert res.completed and res.resumed_from_step == good and res.refused_checkpoints == []
    assert latest_is_good(spec, tmp_path) == 30
    same_as_reference(spec, tmp_path, reference)
    faults.add("kill_points_survived")


@pytest.mark.process
@pytest.mark.slow
def test_killed_again_and_again_every_rerun_resumes(tmp_path, digits, reference, faults):
    """Four starts, each killed at another point, each resuming the last good checkpoint."""
    spec = campaign(tmp_path, digits)
    steps = []
    for point, n in [("train-step", 6), ("restore", 1), ("inside-write", 5), ("after-rename", 1)]:
        kill_child(tmp_path, point, n, faults)
        steps.append(latest_is_good(spec, tmp_path))
        faults.add("kill_points_survived")
    assert steps[0] == 4 and steps == sorted(steps), steps
    res = train(spec, tmp_path)
    assert res.completed and res.resumed_from_step == steps[-1]
    same_as_reference(spec, tmp_path, reference)


# --- a disk that fills up during a save ------------------------------------------------------
class Disk:
    """A disk that fills up when told to: writes then stop half-way with ENOSPC.

    ``kept`` is the checkpoint ``LATEST`` named when the first write was refused: a save already
    written when the disk filled (they run in the background) may still commit before that.
    """

    def __init__(self, latest: Any = None) -> None:
        self.full = False
        self.refused = 0
        self.kept: int | None = None
        self._latest = latest

    def check(self) -> None:
        if self.full:
            if not self.refused and self._latest is not None:
                ptr = self._latest()
                self.kept = int(ptr["step"]) if ptr is not None else None
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["payload", "pointer"])
def test_a_full_disk_during_a_save(tmp_path, digits, reference, faults, monkeypatch, where):
    spec = campaign(tmp_path, digits)
    disk = Disk(latest=lambda: manager(spec, tmp_path).latest_pointer())
    if where == "payload":
        write_all = tensorfiles._write_all

        def write_some(f, chunk):
            if disk.full:
                f.write(chunk[: len(chunk) // 2])
            disk.check()
            write_all(f, chunk)

        monkeypatch.setattr(tensorfiles, "_write_all", write_some)
    else:
        write_bytes = LocalStore.write_bytes

        def write_pointer(self, key, *, data):
            if key.endswith("/LATEST"):
                try:
                    disk.check()
                except OSError as exc:
                    raise StorageError(f"cannot write {key!r} in {self.root}: {exc}") from exc
            write_bytes(self, key, data=data)

        monkeypatch.setattr(LocalStore, "write_bytes", write_pointer)

    # Saves are written in the background: the disk fills once a checkpoint is committed, so
    # there is a previous good one to keep.
    def fill_at_step_6(info: dict) -> None:
        if info["step"] >= 6 and not disk.full:
            disk.full = manager(spec, tmp_path).latest_pointer() is not None

    faults.add("faults_injected")
    with pytest.raises(StorageError) as err:
        train(spec, tmp_path, progress=fill_at_step_6)
    assert "No space left on device" in str(err.value) and spec.resolve_run(
        "control"
    ).run_id in str(err.value)
    assert disk.refused >= 1 and disk.kept is not None
    assert latest_is_good(spec, tmp_path) == disk.kept  # the previous checkpoint is intact
    leftovers = [p.name for p in (tmp_path / "out" / "checkpoints").rglob(".tmp-*")]
    assert leftovers == []
    disk.full = False  # space freed
    res = train(spec, tmp_path)
    assert res.completed and res.resumed_from_step == disk.kept and res.refused_checkpoints == []
    same_as_reference(spec, tmp_path, reference)
    faults.add("faults_survived")


# --- a corpus that is not the pinned one ------------------------------------------------------
def _rewrite(path: Path, edit) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


def test_a_corpus_changed_after_pinning_stops_the_audit_and_the_run(tmp_path, digits, faults):
    spec = campaign(tmp_path, digits)
    path = tmp_path / "data" / "digits.csv"
    _rewrite(path, lambda lines: [lines[0], lines[1].replace(",0", ",1", 1), *lines[2:]])
    faults.add("faults_injected")
    with pytest.raises(EssentialInputMissing) as err:
        audit_corpus(spec, base_dir=tmp_path)
    assert err.value.run_id == "audit" and "was altered" in err.value.reason
    assert spec.corpus.sha256 in err.value.reason
    rid = spec.resolve_run("control").run_id
    with pytest.raises(EssentialInputMissing) as err:
        load_corpus(path, corpus_spec=spec.corpus, run_id=rid)
    assert (
        err.value.to_record()["run_id"] == rid and "was altered" in err.value.to_record()["reason"]
    )
    faults.add("faults_survived")


@pytest.mark.parametrize("repinned", [False, True])
def test_a_truncated_corpus_stops_the_audit(tmp_path, digits, faults, repinned):
    spec = campaign(tmp_path, digits)
    path = tmp_path / "data" / "digits.csv"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # cut in the middle of a row
    if repinned:  # someone re-pinned the cut file: the audit still refuses its broken row
        from gpucampaign.core.files import sha256_file

        spec = parse_spec(
            {
                **json.loads((tmp_path / "spec.json").read_text()),
                "corpus": {"path": "data/digits.csv", "sha256": sha256_file(path)},
            }
        )
    faults.add("faults_injected")
    with pytest.raises((EssentialInputMissing, SpecError)) as err:
        audit_corpus(spec, base_dir=tmp_path)
    text = str(err.value)
    assert "digits.csv" in text
    if repinned:  # the broken last row is named by its line
        assert isinstance(err.value, SpecError) and "line" in text and "fields" in text, text
    else:
        assert isinstance(err.value, EssentialInputMissing) and "was altered" in text
    faults.add("faults_survived")


def test_labels_outside_the_trained_classes_stop_the_audit(tmp_path, digits, faults):
    spec = campaign(tmp_path, digits)
    path = tmp_path / "data" / "digits.csv"
    header, *rows = path.read_text().splitlines(keepends=True)
    cols = header.strip().split(",")
    label, split = cols.index("label"), cols.index("split")
    changed = []
    for i, row in enumerate(rows):
        cells = row.rstrip("\n").split(",")
        if cells[split] == "test" and len(changed) < 2:
            cells[label] = "99"
            changed.append(cells[cols.index("id")])
            rows[i] = ",".join(cells) + "\n"
    path.write_text(header + "".join(rows))
    from gpucampaign.core.files import sha256_file

    spec = parse_spec(
        {
            **json.loads((tmp_path / "spec.json").read_text()),
            "corpus": {"path": "data/digits.csv", "sha256": sha256_file(path)},
        }
    )
    faults.add("faults_injected")
    with pytest.raises(EssentialInputMissing) as err:
        audit_corpus(spec, base_dir=tmp_path)
    assert (
        err.value.run_id == "audit"
        and "[99]" in err.value.reason
        and "never in train" in err.value.reason
    )
    report = audit_corpus(spec, base_dir=tmp_path, strict=False)
    finding = next(f for f in report["findings"] if f["check"] == "label_not_in_train")
    assert finding["severity"] == "hard" and finding["examples"] == [99]
    faults.add("faults_survived")
