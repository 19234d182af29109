"""`campaign verify` recomputes the verdict from the folder's raw per-example scores and
metrics, with the function the close uses: a verdict rewritten in ``report.json``, or scores
improved in a ``scores-test.csv``, each re-hashed into ``manifest.json`` (every hash right),
fails naming the number that differs; ``--expect`` with another sha256 fails too.

The folder: a user's regression recipe with ``score()`` (a control that learns nothing, a
variant 'learns' adopted on intervals over its per-example squared errors), closed and sealed.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.verify.checks import verify_output
from tests.close.test_scores import regression_campaign
from tests.helpers import reseal


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    got = regression_campaign(tmp_path_factory.mktemp("regression"))
    # One seed a side: 'learns' wins, but training noise is not measured, so not adopted.
    assert (got["verdict"].kind, got["verdict"].run) == ("inconclusive", "learns")
    return got


@pytest.fixture
def copy(sealed: dict, tmp_path: Path) -> Path:
    return Path(shutil.copytree(sealed["out"], tmp_path / "out"))


def verify(out: Path, *args: str) -> tuple[int, str]:
    got = CliRunner().invoke(app, ["verify", str(out), *args])
    return got.exit_code, " ".join(got.output.split())


@pytest.mark.slow  # seconds of training
def test_the_sealed_verdict_is_recomputed_and_verifies(copy: Path) -> None:
    report = verify_output(copy, reload=False)
    assert report.verified and report.problems == [], report.problems


@pytest.mark.process
def test_a_rewritten_verdict_rehashed_into_the_manifest_fails_naming_the_number(
    copy: Path, sealed: dict
) -> None:
    path = copy / "report.json"
    report = json.loads(path.read_text())
    gain = report["verdict"]["variants"]["learns"]["test"]["gain"]
    report["verdict"]["variants"]["learns"]["test"]["gain"] = round(gain * 3, 6)
    report["verdict"]["kind"] = "negative"
    path.write_text(json.dumps(report, indent=2))
    reseal(copy)  # every hash of the manifest agrees with the files
    checked = verify_output(copy, reload=False)
    assert not checked.verified and checked.codes() == {"verdict_mismatch"}
    (problem,) = checked.problems
    assert problem.path == "report.json"
    assert 'verdict.kind: the folder says "negative", recomputed "inconclusive"' in problem.detail
    assert f"verdict.variants.learns.test.gain: the folder says {round(gain * 3, 6)}, " in (
        problem.detail
    )
    assert f"recomputed {gain}" in problem.detail
    code, text = verify(copy)
    assert code == 4 and "verdict_mismatch" in text and "verdict.kind" in text, text


def improve(path: Path, factor: float) -> None:
    """Scale every per-example value of a scores CSV (a smaller error: an improved run)."""
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (v if k == "id" else repr(float(v) * factor)) for k, v in r.items()})
    path.write_text(buf.getvalue())


@pytest.mark.process
def test_improved_per_example_scores_rehashed_fail_naming_the_gain(
    copy: Path, sealed: dict
) -> None:
    rid = sealed["spec"].resolve_run("learns").run_id
    improve(copy / "runs" / rid / "scores-test.csv", 0.5)
    reseal(copy)
    checked = verify_output(copy, reload=False)
    assert not checked.verified and checked.codes() == {"verdict_mismatch"}
    where = {p.path: p.detail for p in checked.problems}
    assert set(where) == {"manifest.json", "report.json", "report.md", "report.html"}
    sealed_gain = sealed["verdict"].variants["learns"]["test"]["gain"]
    assert (
        f"verdict.variants.learns.test.gain: the folder says {sealed_gain}, recomputed"
        in (where["report.json"])
    )
    # The value, its interval and its spread differ too (named after the first few).
    assert "field(s) of its verdict differ" in where["report.json"]
    assert "verdict.variants.learns.test.se" in where["report.json"]
    code, text = verify(copy)
    assert code == 4 and "verdict.variants.learns.test.gain" in text, text


@pytest.mark.process
def test_expect_with_another_sha256_fails_and_with_the_sealed_one_passes(copy: Path) -> None:
    sha = hashlib.sha256((copy / "manifest.json").read_bytes()).hexdigest()
    code, text = verify(copy, "--expect", sha)
    assert code == 0 and "as expected (--expect)" in text, text
    wrong = "f" * 64
    code, text = verify(copy, "--expect", wrong)
    assert code == 4 and "manifest_not_anchored" in text and wrong in text and sha in text, text
