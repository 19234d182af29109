"""The output folder's writers: plan once, JSON lines, predictions, error analysis, manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpucampaign.close.error_analysis import Predictions, error_analysis, render_error_analysis_md
from gpucampaign.close.manifest import list_files, reference_corpus
from gpucampaign.close.predictions import read_predictions, write_predictions
from gpucampaign.config import SpecError
from gpucampaign.core.errors import FolderError
from gpucampaign.core.files import sha256_file
from gpucampaign.folder.layout import OutputFolder, PlanRewriteError


def test_plan_is_written_once_and_never_rewritten(tmp_path: Path):
    f = OutputFolder(tmp_path)
    digest = f.write_plan_once({"steps": [{"name": "a", "hours": 1.0}]})
    assert (tmp_path / "plan.sha256").read_text() == f"{digest}  plan.json\n"
    assert sha256_file(tmp_path / "plan.json") == digest == f.plan_sha256()
    assert (
        f.write_plan_once({"steps": [{"name": "a", "hours": 1.0}]}) == digest
    )  # a resumed campaign
    before = (tmp_path / "plan.json").read_bytes()
    with pytest.raises(PlanRewriteError, match="never rewritten"):
        f.write_plan_once({"steps": [{"name": "a", "hours": 2.0}]})
    assert (tmp_path / "plan.json").read_bytes() == before


def test_a_plan_written_before_an_upgrade_stays_when_the_new_one_only_adds_keys(tmp_path: Path):
    """A campaign started by an earlier version resumes: the plan it wrote lacks the keys added
    since (the lots' machines, each step's machine), and is kept as written."""
    f = OutputFolder(tmp_path)
    digest = f.write_plan_once({"name": "p", "steps": [{"name": "a", "hours": 1.0}]})
    before = (tmp_path / "plan.json").read_bytes()
    newer = {
        "name": "p",
        "steps": [{"name": "a", "hours": 1.0, "machine": "lot 1 / gpu0"}],
        "machines": [{"lot": 1}],
    }
    assert f.write_plan_once(newer) == digest
    assert (tmp_path / "plan.json").read_bytes() == before
    # A key that changed is another plan, added keys or not.
    newer["steps"][0]["hours"] = 2.0
    with pytest.raises(PlanRewriteError, match="never rewritten"):
        f.write_plan_once(newer)
    assert (tmp_path / "plan.json").read_bytes() == before


def test_json_lines_and_atomic_json(tmp_path: Path):
    f = OutputFolder(tmp_path)
    f.append_jsonl("stops.jsonl", {"stop_id": "stop-1", "reason": "nan"})
    f.append_jsonl("stops.jsonl", {"stop_id": "stop-2", "reason": "below"})
    assert [r["stop_id"] for r in f.read_jsonl("stops.jsonl")] == ["stop-1", "stop-2"]
    assert f.read_jsonl("decisions.jsonl") == [] and f.read_json("absent.json") is None
    f.write_json("runs/r-1/params.json", {"lr": 0.1})
    f.write_json("runs/r-1/params.json", {"lr": 0.2})
    assert f.read_json("runs/r-1/params.json") == {"lr": 0.2}
    assert list_files(tmp_path) == ["runs/r-1/params.json", "stops.jsonl"]  # no temp file left


@pytest.mark.parametrize("bad", ["/etc/passwd", "../elsewhere", "runs/../../x"])
def test_paths_stay_inside(tmp_path: Path, bad: str):
    with pytest.raises(FolderError):
        OutputFolder(tmp_path).path(bad)


def test_predictions_round_trip_exactly(tmp_path: Path):
    conf = np.array([0.1, 1 / 3, 0.7], dtype=np.float32)
    write_predictions(
        tmp_path,
        ids=["a", "b,c", "d"],
        labels=np.array([0, 1, 2]),
        preds=[0, 2, 2],
        confidence=conf,
    )
    back = read_predictions(tmp_path / "predictions.csv")
    assert back.ids == ("a", "b,c", "d")
    assert back.preds == (0, 2, 2)
    assert back.confidence == tuple(float(c) for c in conf)  # exact, no rounding
    with pytest.raises(ValueError, match="same length"):
        write_predictions(tmp_path, ids=["a"], labels=[0, 1], preds=[0], confidence=[0.5])
    with pytest.raises(ValueError, match="no rows"):
        write_predictions(tmp_path, ids=[], labels=[], preds=[], confidence=[])


def test_error_analysis_by_hand():
    # labels 0 0 1 1 2 ; run predicts 0 1 1 1 0 ; control predicts 0 0 0 1 2
    run = Predictions(
        ("a", "b", "c", "d", "e"), (0, 0, 1, 1, 2), (0, 1, 1, 1, 0), (0.9, 0.8, 0.6, 0.7, 0.95)
    )
    control = Predictions(("a", "b", "c", "d", "e"), (0, 0, 1, 1, 2), (0, 0, 0, 1, 2), (0.5,) * 5)
    a = error_analysis(run, control=control)
    assert a["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert a["accuracy"] == pytest.approx(3 / 5)
    per = {c["class"]: c for c in a["per_class"]}
    assert per["0"]["precision"] == pytest.approx(1 / 2) and per["0"]["recall"] == pytest.approx(
        1 / 2
    )
    assert per["1"]["precision"] == pytest.approx(2 / 3) and per["1"]["recall"] == 1.0
    assert per["2"]["precision"] is None and per["2"]["recall"] == 0.0
    assert [e["id"] for e in a["most_confident_errors"]] == ["e", "b"]  # by confidence
    assert a["vs_control"]["right_to_wrong"] == ["b", "e"]
    assert a["vs_control"]["wrong_to_right"] == ["c"]
    md = render_error_analysis_md(a, title="variant")
    assert "`e` (2->0, 0.950)" in md and "right->wrong 2" in md
    assert error_analysis(control)["vs_control"] is None


def test_top_errors_are_capped():
    n = 30
    p = Predictions(
        tuple(f"i{k:02d}" for k in range(n)), (0,) * n, (1,) * n, tuple(k / n for k in range(n))
    )
    top = error_analysis(p, top_k=10)["most_confident_errors"]
    assert [e["id"] for e in top] == [f"i{k:02d}" for k in range(n - 1, n - 11, -1)]


def test_corpus_is_copied_when_small_else_referenced(tmp_path: Path):
    src = tmp_path / "corpus.csv"
    src.write_text("id,split,label,f0\na,train,0,1\n")
    out = tmp_path / "out"
    ref = reference_corpus(out, src, sha256=sha256_file(src))
    assert ref["kind"] == "copied" and ref["path"] == "data/corpus.csv"
    assert sha256_file(out / ref["path"]) == ref["sha256"]
    ext = reference_corpus(out, src, copy_limit_bytes=10)
    assert ext["kind"] == "external" and ext["location"] == str(src.resolve())
    with pytest.raises(SpecError, match="pinned"):
        reference_corpus(out, src, sha256="0" * 64)


def test_manifest_lists_every_file_but_itself(closed: dict):
    out = closed["out"]  # the session's closed folder (tests/conftest.py), only read here
    m = json.loads((out / "manifest.json").read_text())
    listed = {e["path"]: e for e in m["files"]}
    assert set(listed) == set(list_files(out)) and "manifest.json" not in listed
    for rel in (
        "plan.json",
        "plan.sha256",
        "spec.yaml",
        "report.md",
        "report.html",
        "report.json",
        "RELOAD.md",
        "estimates.json",
        "timeline.jsonl",
        "decisions.jsonl",
        "data/corpus.csv",
        "figures/confusion.png",
    ):
        assert rel in listed, rel
    e = listed["report.md"]
    assert e["size"] == (out / "report.md").stat().st_size and e["sha256"] == sha256_file(
        out / "report.md"
    )
    assert m["plan_sha256"] == (out / "plan.sha256").read_text().split()[0]
    assert {v["status"] for v in m["runs"].values()} == {"completed"}
    assert m["verdict"]["kind"] in ("adopt", "negative", "inconclusive")
    assert m["budget"]["spent_usd"] == 47.14
    assert m["corpus"]["kind"] == "copied"
    assert m["environment"]["torch"]
    reload_md = (out / "RELOAD.md").read_text()
    first = next(iter(m["runs"]))
    assert f'python -m gpucampaign.predictions reload-check "$OUT" {first}' in reload_md
    assert 'campaign verify "$OUT"' in reload_md


def test_written_files_follow_the_umask_not_mkstemps_0600(tmp_path):
    import os

    from gpucampaign.folder.layout import OutputFolder

    mask = os.umask(0o022)
    os.umask(mask)
    path = OutputFolder(tmp_path).write_json("report.json", {"ok": True})
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
