"""The fixed corpus: the bundled digits file, loading, and every audit finding."""

from __future__ import annotations

import csv
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpucampaign.config import SpecError, parse_spec
from gpucampaign.core.stoprules import EssentialInputMissing
from gpucampaign.data import corpus as corpus_module
from gpucampaign.data.corpus import load_corpus
from gpucampaign.data.tables import write_digits_corpus
from gpucampaign.recipe.audit import audit_corpus
from tests.helpers import digits_file  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]


def test_digits_corpus_is_deterministic_and_matches_the_example(tmp_path, digits_file):  # noqa: F811
    sha_a = write_digits_corpus(tmp_path / "a.csv")
    sha_b = write_digits_corpus(tmp_path / "b.csv")
    assert sha_a == sha_b == digits_file[1]
    assert hashlib.sha256((tmp_path / "a.csv").read_bytes()).hexdigest() == sha_a
    assert write_digits_corpus(tmp_path / "c.csv", seed=1) != sha_a
    example = yaml.safe_load((REPO / "examples/digits/campaign.yaml").read_text())
    assert example["corpus"]["sha256"] == sha_a
    assert (
        hashlib.sha256((REPO / "examples/digits/data/digits.csv").read_bytes()).hexdigest() == sha_a
    )


def _spec(base: Path, rel: str, sha: str, **extra) -> object:
    return parse_spec(
        {
            "name": "t",
            "packages": [{"gpu": "rtx4090", "days": 3}],
            "calendar": [{"name": "p", "kind": "human", "hours": 1}],
            "corpus": {"path": rel, "sha256": sha},
            "decision_rule": {"metric": "accuracy", "threshold": 0.5},
            **extra,
        }
    )


def test_load_digits(digits_file):  # noqa: F811
    path, sha = digits_file
    spec = _spec(path.parent, path.name, sha)
    c = load_corpus(path, corpus_spec=spec.corpus)
    sizes = {k: len(v) for k, v in c.splits.items()}
    assert sum(sizes.values()) == 1797 and all(sizes[k] > 0 for k in ("train", "val", "test"))
    assert c.n_features == 64 and c.n_classes == 10 and c.classes == tuple(range(10))
    X, y = c.split("train").tensors()
    assert X.dtype.is_floating_point and X.shape == (sizes["train"], 64) and y.max() == 9
    ids = np.concatenate([s.ids for s in c.splits.values()])
    assert len(set(ids.tolist())) == 1797


def test_audit_of_the_digits_corpus_is_clean(digits_file):  # noqa: F811
    path, sha = digits_file
    report = audit_corpus(_spec(path.parent, path.name, sha), base_dir=path.parent)
    assert report["ok"] and report["findings"] == [] and report["sha256"]["actual"] == sha
    assert report["rows"]["total"] == 1797
    assert sum(report["label_counts"]["test"].values()) == report["rows"]["test"]
    assert report["columns"]["n_features"] == 64


def test_missing_and_altered_corpus_stop(tmp_path, digits_file):  # noqa: F811
    path, sha = digits_file
    spec = _spec(tmp_path, "digits.csv", sha)
    with pytest.raises(EssentialInputMissing, match="missing") as exc:
        audit_corpus(spec, base_dir=tmp_path)
    assert exc.value.run_id == "audit"
    data = path.read_bytes()
    (tmp_path / "digits.csv").write_bytes(data[:-200])  # cut off
    with pytest.raises(EssentialInputMissing, match="altered"):
        audit_corpus(spec, base_dir=tmp_path)
    (tmp_path / "digits.csv").write_bytes(data.replace(b"d0001,", b"d0001x,", 1))
    with pytest.raises(EssentialInputMissing, match="altered"):
        load_corpus(tmp_path / "digits.csv", corpus_spec=spec.corpus)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_corpus_swapped_between_its_check_and_its_read_is_never_used(tmp_path, monkeypatch, fmt):
    """The sha256 check and the parse read one set of bytes: a swap on disk after the check
    (made by the hook that parses, i.e. between the two points) changes nothing."""
    path = tmp_path / f"c.{fmt}"
    swapped = [[r[0], r[1], 1 - r[2], r[3], r[4]] for r in CLEAN]
    if fmt == "csv":
        sha = _write(path, CLEAN)
        _write(tmp_path / "other", swapped)
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        for rows, dest in ((CLEAN, path), (swapped, tmp_path / "other")):
            cols = ["id", "split", "label", "a", "b"]
            pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)}), dest)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
    spec = _spec(tmp_path, path.name, sha)
    honest = load_corpus(path, corpus_spec=spec.corpus)
    real_read = corpus_module.read_table
    swaps = []

    def swap_then_read(*args, **kwargs):
        os.replace(tmp_path / "other", path)  # the attacker's bytes land after the check
        swaps.append(1)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(corpus_module, "read_table", swap_then_read)
    loaded = load_corpus(path, corpus_spec=spec.corpus)
    assert swaps == [1] and hashlib.sha256(path.read_bytes()).hexdigest() != sha
    assert loaded.sha256 == sha
    for name in ("train", "val", "test"):
        assert loaded.splits[name].y.tolist() == honest.splits[name].y.tolist()


def _write(path: Path, rows: list[list]) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["id", "split", "label", "a", "b"])
        w.writerows(rows)
    return hashlib.sha256(path.read_bytes()).hexdigest()


CLEAN = [
    ["r1", "train", 0, 0.0, 1.0],
    ["r2", "train", 1, 1.0, 0.0],
    ["r3", "train", 0, 0.1, 1.1],
    ["r4", "train", 1, 1.1, 0.1],
    ["r5", "val", 0, 0.2, 1.2],
    ["r6", "val", 1, 1.2, 0.2],
    ["r7", "test", 0, 0.3, 1.3],
    ["r8", "test", 1, 1.3, 0.3],
]


def _audit(tmp_path: Path, rows: list[list], *, strict: bool) -> dict:
    sha = _write(tmp_path / "c.csv", rows)
    return audit_corpus(_spec(tmp_path, "c.csv", sha), base_dir=tmp_path, strict=strict)


@pytest.mark.parametrize(
    ("check", "rows"),
    [
        ("duplicate_ids", CLEAN + [["r1", "test", 1, 5.0, 5.0]]),
        ("leakage_across_splits", CLEAN + [["r9", "test", 0, 0.0, 1.0]]),
        (
            "non_finite_features",
            CLEAN + [["r9", "train", 0, "nan", 1.0], ["r10", "test", 1, "", 2.0]],
        ),
        ("empty_split", [r for r in CLEAN if r[1] != "train"]),
        ("empty_split", [r for r in CLEAN if r[1] != "test"]),
        ("label_not_in_train", CLEAN + [["r9", "test", 2, 7.0, 7.0]]),
    ],
)
def test_hard_findings_raise(tmp_path, check, rows):
    with pytest.raises(EssentialInputMissing, match="failed its audit"):
        _audit(tmp_path, rows, strict=True)
    report = _audit(tmp_path, rows, strict=False)
    assert not report["ok"]
    assert any(f["check"] == check and f["severity"] == "hard" for f in report["findings"])


@pytest.mark.parametrize(
    ("check", "rows"),
    [
        ("label_missing_from_split", [r for r in CLEAN if r[0] != "r6"]),
        ("duplicate_rows_within_split", CLEAN + [["r9", "train", 0, 0.0, 1.0]]),
        ("conflicting_labels", CLEAN + [["r9", "train", 1, 0.0, 1.0]]),
    ],
)
def test_soft_findings_are_listed(tmp_path, check, rows):
    report = _audit(tmp_path, rows, strict=True)
    assert report["ok"] and report["n_hard"] == 0
    assert any(f["check"] == check and f["severity"] == "soft" for f in report["findings"])


def test_a_corpus_without_val_is_a_spec_error_with_the_fix(tmp_path):
    rows = [r for r in CLEAN if r[1] != "val"]
    with pytest.raises(SpecError, match="no 'val' rows.*fix: mark some training rows") as err:
        _audit(tmp_path, rows, strict=True)
    assert err.value.field == "decision_rule.select_split"
    report = _audit(tmp_path, rows, strict=False)
    assert any(
        f["check"] == "empty_split"
        and f["severity"] == "hard"
        and "chooses the winner" in f["message"]
        for f in report["findings"]
    )


def test_bad_columns_are_spec_errors(tmp_path):
    sha = _write(tmp_path / "c.csv", CLEAN + [["r9", "train", 0, "abc", 1.0]])
    with pytest.raises(SpecError, match="non-number"):
        audit_corpus(_spec(tmp_path, "c.csv", sha), base_dir=tmp_path)
    sha = _write(tmp_path / "d.csv", [["r1", "holdout", 0, 1.0, 1.0]])
    with pytest.raises(SpecError, match="unknown split"):
        audit_corpus(_spec(tmp_path, "d.csv", sha), base_dir=tmp_path)
    spec = parse_spec(
        {
            "name": "t",
            "packages": [{"gpu": "rtx4090", "days": 3}],
            "calendar": [{"name": "p", "kind": "human", "hours": 1}],
            "corpus": {
                "path": "c.csv",
                "sha256": _write(tmp_path / "c.csv", CLEAN),
                "label_column": "target",
            },
        }
    )
    with pytest.raises(SpecError, match="target"):
        audit_corpus(spec, base_dir=tmp_path)


def test_corpus_path_cannot_escape(tmp_path, digits_file):  # noqa: F811
    path, sha = digits_file
    with pytest.raises(SpecError, match="inside"):
        _spec(tmp_path, "../digits.csv", sha)
    inner = tmp_path / "campaign"
    inner.mkdir()
    os.symlink(path, inner / "link.csv")  # a link that leads out of the spec's folder
    with pytest.raises(SpecError, match="outside"):
        audit_corpus(_spec(inner, "link.csv", sha), base_dir=inner)


def test_parquet_corpus(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "id": [r[0] for r in CLEAN],
            "split": [r[1] for r in CLEAN],
            "label": [r[2] for r in CLEAN],
            "a": [r[3] for r in CLEAN],
            "b": [r[4] for r in CLEAN],
        }
    )
    pq.write_table(table, tmp_path / "c.parquet")
    sha = hashlib.sha256((tmp_path / "c.parquet").read_bytes()).hexdigest()
    report = audit_corpus(_spec(tmp_path, "c.parquet", sha), base_dir=tmp_path)
    assert report["ok"] and report["rows"]["train"] == 4
