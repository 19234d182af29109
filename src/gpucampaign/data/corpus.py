"""The fixed corpus: load a pinned corpus, audit it (the file formats and the bundled digits
corpus: ``corpus_files``).

A corpus is one CSV (or Parquet, when pyarrow is installed) with an ID column, a split column
(``train``, ``val``, ``test``), a label column and numeric feature columns. The spec pins its
sha256; a file that is missing or differs is an ``EssentialInputMissing`` stop.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpucampaign.config import CampaignSpec, CorpusSpec, SpecError, resolve_inside
from gpucampaign.config.recipefile import use_recipe_dir
from gpucampaign.core.files import sha256_bytes
from gpucampaign.core.stoprules import EssentialInputMissing
from gpucampaign.data.pins import pin, pin_inputs, resolve_inputs
from gpucampaign.data.tables import Table, read_table

SPLITS: tuple[str, ...] = ("train", "val", "test")
AUDIT_RUN_ID = "audit"


@dataclass(frozen=True)
class Split:
    """One split: row IDs, features (float32) and class indices (int64)."""

    ids: np.ndarray
    X: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def tensors(self) -> tuple[Any, Any]:
        """``(X, y)`` as torch tensors (float32, int64), sharing memory with the arrays."""
        # torch only for tensors: `import gpucampaign` and `campaign plan` stay without it
        import torch

        return torch.from_numpy(self.X), torch.from_numpy(self.y)


@dataclass(frozen=True)
class Corpus:
    """A loaded, hash-checked corpus. Labels are indices into ``classes``."""

    path: Path
    sha256: str
    splits: dict[str, Split]
    feature_names: tuple[str, ...]
    classes: tuple[Any, ...]
    load_s: float = field(default=0.0, compare=False)
    inputs: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def split(self, name: str) -> Split:
        """The split ``name`` (``train``, ``val`` or ``test``)."""
        return self.splits[name]


def _parse_label(values: list[str]) -> tuple[tuple[Any, ...], dict[str, int]]:
    """Sorted classes (numerically when all labels are integers) and the label -> index map."""
    uniq = sorted(set(values))
    try:
        ints = sorted({int(v) for v in uniq})
        classes: tuple[Any, ...] = tuple(ints)
        index = {v: ints.index(int(v)) for v in uniq}
    except ValueError:
        classes = tuple(uniq)
        index = {v: i for i, v in enumerate(uniq)}
    return classes, index


def _features(table: Table, names: tuple[str, ...], *, source: str) -> np.ndarray:
    cols = []
    for name in names:
        try:
            cols.append(np.array([float(v) if v != "" else math.nan for v in table.data[name]]))
        except ValueError:
            bad = next(v for v in table.data[name] if v != "" and not _is_float(v))
            raise SpecError(
                f"corpus {source}: feature column '{name}' holds a non-number ({bad!r}); "
                "every column other than id, split and label must be numeric.",
                field="corpus.path",
            ) from None
    return np.stack(cols, axis=1) if cols else np.zeros((table.n_rows, 0))


def _is_float(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _check_columns(table: Table, spec: CorpusSpec, *, source: str) -> tuple[str, ...]:
    needed = [spec.id_column, spec.split_column, spec.label_column]
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise SpecError(
            f"corpus {source}: column(s) {missing} not found "
            f"(columns: {list(table.columns)[:8]}...); "
            "name them in corpus.id_column / split_column / label_column.",
            field="corpus",
        )
    feats = tuple(c for c in table.columns if c not in needed)
    if not feats:
        raise SpecError(f"corpus {source}: no feature columns besides {needed}.", field="corpus")
    return feats


def read_pinned_bytes(path: Path, spec: CorpusSpec, *, run_id: str) -> tuple[bytes, str]:
    """The corpus file's bytes, read once, and their sha256 checked against the pin.

    The bytes that were hashed are the bytes parsed: a file swapped after this read is
    never used (a separate hash-then-read would let a swap between the two pass).
    """
    if not path.is_file():
        raise EssentialInputMissing(
            run_id, f"corpus file '{spec.path}' is missing (looked at {path})"
        )
    with open(path, "rb") as f:
        data = f.read()
    actual = sha256_bytes(data)
    if actual != spec.sha256:
        raise EssentialInputMissing(
            run_id,
            f"corpus file '{spec.path}' was altered: sha256 {actual} is not the pinned "
            f"{spec.sha256}",
        )
    return data, actual


def load_corpus(path: str | Path, *, corpus_spec: CorpusSpec, run_id: str = AUDIT_RUN_ID) -> Corpus:
    """Load a corpus file after checking it against its pinned sha256.

    Args:
        path: The corpus file (already resolved inside the spec's folder).
        corpus_spec: The spec's corpus section (hash and column names).
        run_id: Run ID carried by a stop raised here.

    Raises:
        EssentialInputMissing: The file is missing or its sha256 is not the pinned one.
        SpecError: Missing columns, non-numeric features, unknown split names, empty labels.
    """
    t0 = time.perf_counter()
    p = Path(path)
    raw, sha = read_pinned_bytes(p, corpus_spec, run_id=run_id)
    source = f"'{corpus_spec.path}'"
    table = read_table(p, data=raw)
    feats = _check_columns(table, corpus_spec, source=source)
    split_col = table.data[corpus_spec.split_column]
    unknown = sorted(set(split_col) - set(SPLITS))
    if unknown:
        raise SpecError(
            f"corpus {source}: unknown split name(s) {unknown[:5]}; use train, val or test.",
            field="corpus",
        )
    labels = table.data[corpus_spec.label_column]
    if any(v == "" for v in labels):
        raise SpecError(
            f"corpus {source}: empty label(s) in column '{corpus_spec.label_column}'.",
            field="corpus",
        )
    classes, index = _parse_label(labels)
    X = _features(table, feats, source=source).astype(np.float32)
    y = np.array([index[v] for v in labels], dtype=np.int64)
    ids = np.array(table.data[corpus_spec.id_column], dtype=object)
    split_arr = np.array(split_col, dtype=object)
    splits = {}
    for name in SPLITS:
        m = split_arr == name
        splits[name] = Split(ids=ids[m], X=np.ascontiguousarray(X[m]), y=y[m])
    load_s = time.perf_counter() - t0
    return Corpus(
        path=p, sha256=sha, splits=splits, feature_names=feats, classes=classes, load_s=load_s
    )


def corpus_path(spec: CampaignSpec, *, base_dir: str | Path) -> Path:
    """The corpus file of ``spec``, resolved inside ``base_dir`` (the spec's folder).

    The folder is also put on ``sys.path``, where the spec's recipes are imported from.
    """
    use_recipe_dir(base_dir)
    if spec.corpus is None:
        raise SpecError("the spec has no 'corpus' section: add path and sha256.", field="corpus")
    return resolve_inside(base_dir, spec.corpus.path, field="corpus.path")


def load_spec_corpus(
    spec: CampaignSpec, *, base_dir: str | Path, run_id: str = AUDIT_RUN_ID
) -> Any:
    """The corpus a spec pins (path relative to ``base_dir``), with its other pinned inputs.

    A table ``Corpus`` when a run uses a built-in recipe; otherwise a ``Pinned`` file or
    folder that the recipe reads itself.
    """
    path = corpus_path(spec, base_dir=base_dir)
    return open_corpus(path, spec=spec, base_dir=base_dir, run_id=run_id)


def open_corpus(
    path: str | Path,
    *,
    spec: CampaignSpec,
    base_dir: str | Path | None,
    run_id: str = AUDIT_RUN_ID,
    input_paths: Mapping[str, Path] | None = None,
) -> Any:
    """``load_spec_corpus`` for a corpus already resolved to ``path``; the pinned inputs are
    at ``input_paths`` (``pins.resolve_inputs``), or resolved from ``base_dir``.

    Raises:
        EssentialInputMissing: The corpus or an input is missing or not the pinned one.
        SpecError: The spec pins inputs and neither ``input_paths`` nor ``base_dir`` is given.
    """
    assert spec.corpus is not None
    inputs = {}
    if spec.inputs:
        paths = input_paths if input_paths is not None else resolve_inputs(spec, base_dir=base_dir)
        inputs = pin_inputs(spec, paths=paths, run_id=run_id)
    if spec.needs_table():
        if Path(path).is_dir():  # there, but not what a built-in reads: no "missing file"
            builtins = sorted(
                {c.recipe for c in map(spec.run_config, spec.run_names()) if c.builtin}
            )
            raise SpecError(
                f"corpus.path: '{spec.corpus.path}' is a folder, and the built-in recipe "
                f"{', '.join(builtins)} reads a CSV table (one row per example: its id, split "
                "and label columns and the features). Give corpus.path a .csv file (pinned "
                "with `campaign pin`), or a recipe of your own that reads the folder "
                "(docs/recipes.md).",
                field="corpus.path",
            )
        corpus = load_corpus(path, corpus_spec=spec.corpus, run_id=run_id)
        return replace(corpus, inputs=inputs)
    pinned = pin(
        Path(path), sha256=spec.corpus.sha256, run_id=run_id, label=f"corpus '{spec.corpus.path}'"
    )
    return replace(pinned, inputs=inputs)


# --- the audit -------------------------------------------------------------------------
def _finding(
    check: str, severity: str, message: str, *, count: int = 0, examples: list[Any] | None = None
) -> dict:
    return {
        "check": check,
        "severity": severity,
        "message": message,
        "count": count,
        "examples": (examples or [])[:5],
    }


def audit_table_corpus(
    spec: CampaignSpec, *, base_dir: str | Path, strict: bool = True
) -> dict[str, Any]:
    """Audit the spec's corpus table (built-in recipes) and return a JSON-ready report.

    Hard findings (the corpus cannot give a trustworthy decision): missing file or altered hash,
    duplicate IDs, the same feature row in two splits (leakage), non-finite features, an empty
    train split or decision split, a class in val/test that train never shows. Soft findings
    are listed: rows repeated inside one split, conflicting labels for one feature row, a class
    absent from val or test, an empty split the decision does not use.

    Args:
        spec: The campaign spec (its ``corpus`` section and decision rule are used).
        base_dir: The spec file's folder; the corpus path is resolved inside it.
        strict: Raise on hard findings (default). With False, return the report with ``ok``
            False instead (a missing or altered file still raises).

    Raises:
        EssentialInputMissing: File missing or altered, or (strict) any hard finding.
        SpecError: No corpus section, a path escaping ``base_dir``, unreadable columns.
    """
    t0 = time.perf_counter()
    path = corpus_path(spec, base_dir=base_dir)
    assert spec.corpus is not None
    cs = spec.corpus
    corpus = load_corpus(path, corpus_spec=cs, run_id=AUDIT_RUN_ID)
    decision_split = spec.decision_split
    if spec.decision_rule is not None and strict:
        _require_selection_split(corpus, split=spec.selection_split, source=cs.path)
    findings = [
        *_duplicate_ids(corpus),
        *empty_splits(corpus, decision_split=decision_split, select_split=spec.selection_split),
        *_non_finite_features(corpus),
        *_repeated_rows(corpus),
        *_class_coverage(corpus),
    ]
    hard = [f for f in findings if f["severity"] == "hard"]
    if hard and strict:
        raise EssentialInputMissing(
            AUDIT_RUN_ID,
            f"corpus '{cs.path}' failed its audit: " + "; ".join(f["message"] for f in hard),
        )
    report = _describe(corpus, cs, size=path.stat().st_size)
    return {
        "ok": not hard,
        **report,
        "decision_split": decision_split,
        "findings": findings,
        "n_hard": len(hard),
        "n_soft": len(findings) - len(hard),
        "audit_s": round(time.perf_counter() - t0, 6),
    }


def _describe(corpus: Corpus, cs: CorpusSpec, *, size: int) -> dict[str, Any]:
    """What the audit report says of the file itself: hash, columns, rows, classes."""
    return {
        "path": cs.path,
        "sha256": {"pinned": cs.sha256, "actual": corpus.sha256, "match": True},
        "bytes": size,
        "columns": {
            "id": cs.id_column,
            "split": cs.split_column,
            "label": cs.label_column,
            "n_features": corpus.n_features,
            "features": list(corpus.feature_names),
        },
        "rows": {
            "total": int(sum(len(s) for s in corpus.splits.values())),
            **{name: len(corpus.splits[name]) for name in SPLITS},
        },
        "classes": list(corpus.classes),
        "label_counts": {
            name: {
                str(corpus.classes[i]): int(n)
                for i, n in enumerate(
                    np.bincount(corpus.splits[name].y, minlength=corpus.n_classes)
                )
            }
            for name in SPLITS
        },
    }


def _duplicate_ids(corpus: Corpus) -> list[dict]:
    """Hard: an ID that occurs more than once, in one split or across splits."""
    all_ids = np.concatenate([corpus.splits[s].ids for s in SPLITS])
    dup_ids = sorted(k for k, v in Counter(all_ids.tolist()).items() if v > 1)
    if not dup_ids:
        return []
    return [
        _finding(
            "duplicate_ids",
            "hard",
            f"{len(dup_ids)} ID(s) occur more than once",
            count=len(dup_ids),
            examples=dup_ids,
        )
    ]


def _require_selection_split(corpus: Corpus, *, split: str, source: str) -> None:
    """A spec error, with its fix, when the split the winner is chosen on has no row."""
    if len(corpus.splits[split]):
        return
    raise SpecError(
        f"corpus '{source}' has no '{split}' rows, and decision_rule.select_split chooses the "
        f"winner on '{split}'; fix: mark some training rows (e.g. 15%) with split '{split}' "
        "in the corpus, re-pin its sha256, and keep the test rows for the report",
        field="decision_rule.select_split",
    )


def empty_splits(corpus: Corpus, *, decision_split: str, select_split: str = "val") -> list[dict]:
    """Hard for an empty train, selection or decision split, soft for another empty split."""
    findings = []
    for name in SPLITS:
        if len(corpus.splits[name]):
            continue
        hard = name in ("train", decision_split, select_split)
        if name == "train":
            why = "training needs it"
        elif name == select_split:
            why = "the decision rule chooses the winner on it"
        elif hard:
            why = "the decision rule reports on it"
        else:
            why = "only evaluation during training uses it"
        findings.append(
            _finding(
                "empty_split",
                "hard" if hard else "soft",
                f"split '{name}' is empty ({why})",
                count=0,
                examples=[name],
            )
        )
    return findings


def _non_finite_features(corpus: Corpus) -> list[dict]:
    """Hard: rows with NaN, infinite or empty feature values."""
    bad: list[str] = []
    for name in SPLITS:
        sp = corpus.splits[name]
        bad += sp.ids[~np.isfinite(sp.X).all(axis=1)].tolist()
    if not bad:
        return []
    return [
        _finding(
            "non_finite_features",
            "hard",
            f"{len(bad)} row(s) have NaN, infinite or empty feature values",
            count=len(bad),
            examples=bad,
        )
    ]


def _repeated_rows(corpus: Corpus) -> list[dict]:
    """The same feature row twice: across splits (hard, leakage), inside one split (soft),
    or with different labels (soft)."""
    # The bytes of the float32 row are the key.
    where: dict[bytes, dict[str, list[str]]] = {}
    labels_of: dict[bytes, set[int]] = {}
    for name in SPLITS:
        sp = corpus.splits[name]
        for rid, row, lab in zip(sp.ids.tolist(), sp.X, sp.y.tolist(), strict=True):
            key = row.tobytes()
            where.setdefault(key, {}).setdefault(name, []).append(rid)
            labels_of.setdefault(key, set()).add(lab)
    findings = []
    leaks = [ids for ids in where.values() if len(ids) > 1]
    if leaks:
        findings.append(
            _finding(
                "leakage_across_splits",
                "hard",
                f"{len(leaks)} feature row(s) appear in more than one split",
                count=len(leaks),
                examples=[{s: v[:3] for s, v in d.items()} for d in leaks],
            )
        )
    within = [d for d in where.values() if len(d) == 1 and len(next(iter(d.values()))) > 1]
    if within:
        findings.append(
            _finding(
                "duplicate_rows_within_split",
                "soft",
                f"{len(within)} feature row(s) repeat inside one split",
                count=len(within),
                examples=[next(iter(d.values()))[:3] for d in within],
            )
        )
    conflicts = [k for k, labs in labels_of.items() if len(labs) > 1]
    if conflicts:
        findings.append(
            _finding(
                "conflicting_labels",
                "soft",
                f"{len(conflicts)} feature row(s) carry different labels",
                count=len(conflicts),
                examples=[sorted(sum(where[k].values(), []))[:3] for k in conflicts],
            )
        )
    return findings


def _class_coverage(corpus: Corpus) -> list[dict]:
    """A class of val/test that train never shows (hard), or absent from val/test (soft)."""
    present = {name: set(corpus.splits[name].y.tolist()) for name in SPLITS}
    findings = []
    for name in ("val", "test"):
        if not len(corpus.splits[name]) or not len(corpus.splits["train"]):
            continue
        unseen = [corpus.classes[i] for i in sorted(present[name] - present["train"])]
        if unseen:
            findings.append(
                _finding(
                    "label_not_in_train",
                    "hard",
                    f"class(es) {unseen} occur in '{name}' but never in train",
                    count=len(unseen),
                    examples=unseen,
                )
            )
        absent = sorted(set(range(corpus.n_classes)) - present[name])
        if absent:
            labs = [corpus.classes[i] for i in absent]
            findings.append(
                _finding(
                    "label_missing_from_split",
                    "soft",
                    f"class(es) {labs} are absent from '{name}'",
                    count=len(labs),
                    examples=labs,
                )
            )
    return findings
