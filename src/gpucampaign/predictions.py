"""Predictions on the decision split, their error analysis, and reloading a saved model.

Each completed run writes ``predictions.csv`` from its SAVED model on CPU; a reload in a fresh
process must reproduce that file exactly. This module is also that fresh process::

    python -m gpucampaign.predictions reload-check OUT [RUN_ID ...] [--json]
    python -m gpucampaign.predictions predict OUT RUN_ID [--to FILE.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucampaign.folder import SPEC_COPY, OutputFolder
from gpucampaign.manifest import corpus_file, read_manifest
from gpucampaign.spec import SpecError, load_spec

PREDICTION_COLUMNS = ("id", "label", "prediction", "confidence")
PREDICTIONS_FILE = "predictions.csv"


def predictions_file(split: str, *, report_split: str) -> str:
    """The file of a run's predictions on ``split``: ``predictions.csv`` on the report split
    (the one the reload check reproduces), ``predictions-<split>.csv`` on another split."""
    return PREDICTIONS_FILE if split == report_split else f"predictions-{split}.csv"


@dataclass(frozen=True)
class Predictions:
    """One run's predictions on the decision split, in a fixed row order."""

    ids: tuple[str, ...]
    labels: tuple[int, ...]
    preds: tuple[int, ...]
    confidence: tuple[float, ...]

    def __post_init__(self) -> None:
        n = len(self.ids)
        assert len(self.labels) == n and len(self.preds) == n and len(self.confidence) == n

    @property
    def correct(self) -> list[bool]:
        """Per row: prediction equals label."""
        return [p == y for p, y in zip(self.preds, self.labels, strict=True)]


def _tolist(x: Any) -> list[Any]:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    if hasattr(x, "tolist"):
        return list(x.tolist())
    return list(x)


def _csv_cell(s: str) -> str:
    if any(ch in s for ch in ',"\n\r'):
        return '"' + s.replace('"', '""') + '"'
    return s


def _predictions_csv(
    ids: Sequence[Any], *, labels: Sequence[Any], preds: Sequence[Any], confidence: Sequence[Any]
) -> str:
    """The CSV text; ``repr`` of each float confidence, so a read gives back the same floats."""
    lines = [",".join(PREDICTION_COLUMNS)]
    for i, y, p, c in zip(ids, labels, preds, confidence, strict=True):
        lines.append(f"{_csv_cell(str(i))},{int(y)},{int(p)},{float(c)!r}")
    return "\n".join(lines) + "\n"


def write_predictions(
    run_dir: str | Path,
    *,
    ids: Sequence[Any],
    labels: Sequence[int] | Any,
    preds: Sequence[int] | Any,
    confidence: Sequence[float] | Any,
    name: str = PREDICTIONS_FILE,
) -> Path:
    """Write ``predictions.csv`` (id, label, prediction, confidence), or ``name``.

    Confidences are written with ``repr`` of the Python float, so reading the file back gives
    the very same floats: the reload check compares them exactly. Compute them on CPU with the
    run's thread count, as the check will.

    Returns:
        The path written.
    """
    ids_l, labels_l = _tolist(ids), _tolist(labels)
    preds_l, conf_l = _tolist(preds), _tolist(confidence)
    n = len(ids_l)
    if not (len(labels_l) == len(preds_l) == len(conf_l) == n):
        raise ValueError(
            f"predictions: ids ({n}), labels ({len(labels_l)}), preds ({len(preds_l)}) and "
            f"confidence ({len(conf_l)}) must have the same length"
        )
    if n == 0:
        raise ValueError(
            "predictions: no rows to write; an empty predictions file is not an output"
        )
    text = _predictions_csv(ids_l, labels=labels_l, preds=preds_l, confidence=conf_l)
    return OutputFolder(run_dir).write_text(name, text)


def read_predictions(path: str | Path) -> Predictions:
    """Read a ``predictions.csv`` back.

    Raises:
        ValueError: the header or a row is malformed.
    """
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(header) != PREDICTION_COLUMNS:
            raise ValueError(f"{path}: header must be {','.join(PREDICTION_COLUMNS)}, got {header}")
        ids, labels, preds, conf = [], [], [], []
        for n, row in enumerate(reader, start=2):
            if len(row) != 4:
                raise ValueError(f"{path}: line {n} has {len(row)} fields, expected 4")
            ids.append(row[0])
            labels.append(int(row[1]))
            preds.append(int(row[2]))
            conf.append(float(row[3]))
    return Predictions(tuple(ids), tuple(labels), tuple(preds), tuple(conf))


# --- error analysis -------------------------------------------------------------------------
def _confusion(predictions: Predictions, *, k: int) -> list[list[int]]:
    confusion = [[0] * k for _ in range(k)]
    for y, p in zip(predictions.labels, predictions.preds, strict=True):
        confusion[y][p] += 1
    return confusion


def _per_class(confusion: list[list[int]], *, names: Sequence[str]) -> list[dict[str, Any]]:
    """Support, precision, recall and F1 of each class (precision/recall None when undefined)."""
    k = len(confusion)
    rows = []
    for c in range(k):
        tp = confusion[c][c]
        support = sum(confusion[c])
        predicted = sum(confusion[r][c] for r in range(k))
        precision = tp / predicted if predicted else None
        recall = tp / support if support else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall > 0
            else 0.0
        )
        rows.append(
            {
                "class": names[c],
                "support": support,
                "predicted": predicted,
                "precision": precision,
                "recall": recall,
                "f1": f1,
            }
        )
    return rows


def _errors_by_confidence(predictions: Predictions) -> list[dict[str, Any]]:
    """The wrong rows, most confident first (ties by ID)."""
    p = predictions
    errors = [
        {"id": i, "label": y, "prediction": pr, "confidence": c}
        for i, y, pr, c, ok in zip(p.ids, p.labels, p.preds, p.confidence, p.correct, strict=True)
        if not ok
    ]
    errors.sort(key=lambda e: (-e["confidence"], e["id"]))
    return errors


def _vs_control(predictions: Predictions, *, control: Predictions) -> dict[str, Any]:
    """The IDs that flip right->wrong and wrong->right against the control."""
    ctrl = dict(zip(control.ids, control.correct, strict=True))
    right_to_wrong, wrong_to_right = [], []
    for i, ok in zip(predictions.ids, predictions.correct, strict=True):
        if i not in ctrl:
            continue
        if ctrl[i] and not ok:
            right_to_wrong.append(i)
        elif not ctrl[i] and ok:
            wrong_to_right.append(i)
    return {
        "compared": sum(1 for i in predictions.ids if i in ctrl),
        "missing_in_control": sorted(set(predictions.ids) - set(ctrl)),
        "right_to_wrong": right_to_wrong,
        "wrong_to_right": wrong_to_right,
        "net_gain": len(wrong_to_right) - len(right_to_wrong),
    }


def error_analysis(
    predictions: Predictions,
    *,
    control: Predictions | None = None,
    class_names: Sequence[str] | None = None,
    top_k: int = 10,
) -> dict[str, Any]:
    """Per-class precision/recall, confusion matrix, most confident errors, flips vs the control.

    Args:
        predictions: the run's predictions.
        control: the control's predictions on the same IDs (None for the control itself).
        class_names: names of classes 0..K-1; by default the labels seen, as strings.
        top_k: how many of the most confident errors to list.

    Returns:
        ``{n, accuracy, macro_f1, classes, per_class, confusion, most_confident_errors,
        vs_control}``; ``confusion[i][j]`` counts label ``classes[i]`` predicted as
        ``classes[j]``; ``vs_control`` lists the IDs that flip right->wrong and wrong->right
        (None without control).
    """
    k = max([*predictions.labels, *predictions.preds]) + 1
    if class_names is not None:
        if len(class_names) < k:
            raise ValueError(
                f"class_names has {len(class_names)} names but classes go up to {k - 1}"
            )
        k = len(class_names)
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    confusion = _confusion(predictions, k=k)
    per_class = _per_class(confusion, names=names)
    f1s = [c["f1"] for c in per_class if c["support"]]
    n = len(predictions.ids)
    errors = _errors_by_confidence(predictions)
    return {
        "n": n,
        "accuracy": sum(predictions.correct) / n if n else None,
        "macro_f1": sum(f1s) / len(f1s) if f1s else None,
        "errors": len(errors),
        "classes": names,
        "per_class": per_class,
        "confusion": confusion,
        "most_confident_errors": errors[:top_k],
        "vs_control": None if control is None else _vs_control(predictions, control=control),
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _id_list(xs: Sequence[str], *, max_ids: int) -> str:
    shown = ", ".join(f"`{x}`" for x in xs[:max_ids])
    more = f" and {len(xs) - max_ids} more" if len(xs) > max_ids else ""
    return (shown + more) if xs else "none"


def render_error_analysis_md(analysis: Mapping[str, Any], *, title: str, max_ids: int = 20) -> str:
    """A short markdown section for one run's error analysis."""
    a = analysis
    lines = [
        f"### {title}",
        "",
        f"{a['n']} predictions, {a['errors']} errors; accuracy {_pct(a['accuracy'])}, "
        f"macro F1 {_pct(a['macro_f1'])}.",
        "",
        "| class | support | precision | recall |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {c['class']} | {c['support']} | {_pct(c['precision'])} | {_pct(c['recall'])} |"
        for c in a["per_class"]
    ]
    lines.append("")
    if a["most_confident_errors"]:
        shown = ", ".join(
            f"`{e['id']}` ({e['label']}->{e['prediction']}, {e['confidence']:.3f})"
            for e in a["most_confident_errors"]
        )
        lines.append(f"Most confident errors: {shown}.")
    else:
        lines.append("No errors on this split.")
    vc = a.get("vs_control")
    if vc is not None:
        lines += [
            "",
            f"Against the control ({vc['compared']} common IDs, net {vc['net_gain']:+d}): "
            f"right->wrong {len(vc['right_to_wrong'])}: "
            f"{_id_list(vc['right_to_wrong'], max_ids=max_ids)}; "
            f"wrong->right {len(vc['wrong_to_right'])}: "
            f"{_id_list(vc['wrong_to_right'], max_ids=max_ids)}.",
        ]
    return "\n".join(lines) + "\n"


# --- reloading a saved model ----------------------------------------------------------------
def _threads_of(*docs: Any) -> int:
    """The run's torch thread count (model config.json or params.json); 1 when absent."""
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        if isinstance(doc.get("threads"), int):
            return int(doc["threads"])
        for key in ("run_config", "config"):
            if isinstance(doc.get(key), Mapping) and isinstance(doc[key].get("threads"), int):
                return int(doc[key]["threads"])
    return 1


def features_for(
    root: str | Path, *, ids: Sequence[str] | None
) -> tuple[list[str], Any, list[int]]:
    """Features of the corpus rows with these IDs (in that order), from the manifest's corpus.

    With ``ids=None``: the rows of the decision split named by the spec's decision rule.

    Returns:
        ``(ids, X, labels)``.
    """
    from gpucampaign.corpus import load_corpus

    manifest = read_manifest(root)
    spec = load_spec(OutputFolder(root).path(SPEC_COPY))
    if spec.corpus is None or manifest.get("corpus") is None:
        raise SpecError("this campaign has no corpus to predict on", field="corpus")
    corpus = load_corpus(corpus_file(root, manifest["corpus"]), corpus_spec=spec.corpus)
    return _rows(corpus, ids=ids, split=spec.decision_split)


def _rows(
    corpus: Any, *, ids: Sequence[str] | None, split: str
) -> tuple[list[str], Any, list[int]]:
    """Rows of a loaded corpus by ID, whatever split they are in (or a whole split)."""
    import numpy as np

    if ids is None:
        part = corpus.split(split)
        return [str(i) for i in part.ids.tolist()], part.X, [int(v) for v in part.y.tolist()]
    names = [n for n in ("train", "val", "test") if n in corpus.splits]
    all_ids = [str(i) for n in names for i in corpus.split(n).ids.tolist()]
    X = np.concatenate([corpus.split(n).X for n in names])
    y = [int(v) for n in names for v in corpus.split(n).y.tolist()]
    index = {i: n for n, i in enumerate(all_ids)}
    missing = [i for i in ids if i not in index]
    if missing:
        raise ValueError(
            f"{len(missing)} prediction ID(s) are not in the corpus, e.g. {missing[:5]}"
        )
    rows = [index[i] for i in ids]
    return list(ids), X[rows], [y[r] for r in rows]


def load_run_model(root: str | Path, run_id: str) -> Any:
    """Load ``runs/<run_id>/model/`` on CPU with the run's recorded thread count."""
    import torch

    from gpucampaign.recipes import load_model_dir

    folder = OutputFolder(root)
    docs = []
    for rel in (f"runs/{run_id}/model/config.json", f"runs/{run_id}/params.json"):
        try:
            docs.append(folder.read_json(rel))
        except ValueError:
            docs.append(None)  # an unreadable file is named by load_model_dir / the verifier
    torch.set_num_threads(_threads_of(*docs))
    model = load_model_dir(folder.path(f"runs/{run_id}/model"))
    if hasattr(model, "eval"):
        model.eval()
    return model


def write_run_predictions(
    root: str | Path, run_id: str, *, corpus: Any, split: str = "test", name: str = PREDICTIONS_FILE
) -> Predictions:
    """Predict ``split`` with the SAVED model of a run, on CPU, and write its ``predictions.csv``.

    Going through the saved ``model/`` folder (not the in-memory model, which may sit on a GPU)
    with the run's thread count is what makes the verifier's fresh-process reload reproduce the
    file exactly. The process's torch thread count is restored afterwards.

    Args:
        root: the output folder.
        run_id: a completed run with ``runs/<run_id>/model/``.
        corpus: the loaded corpus (``gpucampaign.corpus.load_corpus``).
        split: the split to predict (the decision split for ``predictions.csv``).
        name: the file name inside ``runs/<run_id>/``.

    Returns:
        The predictions written.
    """
    import torch

    from gpucampaign.recipes import predict

    threads = torch.get_num_threads()
    try:
        model = load_run_model(root, run_id)
        part = corpus.split(split)
        pred, conf = predict(model, part.X)
    finally:
        torch.set_num_threads(threads)
    path = write_predictions(
        OutputFolder(root).path(f"runs/{run_id}"),
        ids=[str(i) for i in part.ids.tolist()],
        labels=part.y,
        preds=pred,
        confidence=conf,
        name=name,
    )
    return read_predictions(path)


def _compare(
    expected: Predictions, *, ids: list[str], labels: list[int], pred: list[int], conf: list[float]
) -> dict[str, Any]:
    """``{rows, mismatches, first_mismatch, error}`` of a reload against the written file."""
    res: dict[str, Any] = {"rows": len(ids), "error": None, "first_mismatch": None}
    bad = [
        n
        for n in range(len(ids))
        if n >= len(pred)
        or pred[n] != expected.preds[n]
        or conf[n] != expected.confidence[n]
        or labels[n] != expected.labels[n]
    ]
    if len(pred) != len(ids):
        res["error"] = f"predict returned {len(pred)} rows for {len(ids)} inputs"
    res["mismatches"] = len(bad)
    if bad:
        n = bad[0]
        res["first_mismatch"] = {
            "id": ids[n],
            "expected": {
                "label": expected.labels[n],
                "prediction": expected.preds[n],
                "confidence": expected.confidence[n],
            },
            "got": {
                "label": labels[n],
                "prediction": pred[n] if n < len(pred) else None,
                "confidence": conf[n] if n < len(conf) else None,
            },
        }
    return res


def reload_check(
    root: str | Path, run_ids: Sequence[str], *, corpus: Any = None
) -> dict[str, dict[str, Any]]:
    """Reload each run's model here and compare its predictions with ``predictions.csv``.

    Meant to run in a fresh process (see ``verify_output``). Exactly equal means the same
    predicted class and the same float confidence on every row. ``corpus``: the loaded corpus,
    before the manifest that names it exists; by default the manifest's corpus is read.

    Returns:
        ``{run_id: {ok, rows, mismatches, first_mismatch, error}}``.
    """
    from gpucampaign.recipes import predict

    out: dict[str, dict[str, Any]] = {}
    for rid in run_ids:
        res: dict[str, Any] = {
            "ok": False,
            "rows": 0,
            "mismatches": None,
            "first_mismatch": None,
            "error": None,
        }
        out[rid] = res
        if not _builtin_model(root, rid):
            res.update(_recipe_check(root, rid, corpus=corpus))
            continue
        try:
            expected = read_predictions(OutputFolder(root).path(f"runs/{rid}/predictions.csv"))
            want = list(expected.ids)
            ids, X, labels = (
                features_for(root, ids=want)
                if corpus is None
                else _rows(corpus, ids=want, split="test")
            )
            model = load_run_model(root, rid)
            pred, conf = predict(model, X)
            pred_l, conf_l = [int(v) for v in _tolist(pred)], [float(v) for v in _tolist(conf)]
        except Exception as exc:  # any failure to reload is the finding, reported by name
            res["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            continue
        res.update(_compare(expected, ids=ids, labels=labels, pred=pred_l, conf=conf_l))
        res["ok"] = not res["mismatches"] and res["error"] is None
    return out


def _builtin_model(root: str | Path, run_id: str) -> bool:
    """True unless the run's model ``config.json`` names a user's recipe."""
    from gpucampaign.spec import BUILTIN_RECIPES

    try:
        info = OutputFolder(root).read_json(f"runs/{run_id}/model/config.json")
    except (OSError, ValueError):
        return True  # the builtin path reports the unreadable folder by name
    return not isinstance(info, Mapping) or info.get("recipe", "mlp") in BUILTIN_RECIPES


def _recipe_check(root: str | Path, run_id: str, *, corpus: Any) -> dict[str, Any]:
    """``recipe_reload_check``, with any failure reported as the finding."""
    from gpucampaign.recipe_predictions import recipe_reload_check

    try:
        return recipe_reload_check(root, run_id, corpus=corpus)
    except Exception as exc:  # any failure to reload is the finding, reported by name
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000]}


def reload_in_fresh_process(
    root: str | Path, run_ids: Sequence[str], *, timeout_s: float = 600
) -> dict[str, dict[str, Any]]:
    """Run ``reload_check`` in a new Python process on CPU and return its findings."""
    if not run_ids:
        return {}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [
        sys.executable,
        "-m",
        "gpucampaign.predictions",
        "reload-check",
        str(Path(root).resolve()),
        *run_ids,
        "--json",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        error = f"the reload process ran past {timeout_s:g} s"
        return {rid: {"ok": False, "error": error} for rid in run_ids}
    try:
        found = json.loads(proc.stdout)
    except json.JSONDecodeError:
        tail = (proc.stderr or proc.stdout)[-800:]
        error = f"the reload process failed (exit {proc.returncode}): {tail}"
        return {rid: {"ok": False, "error": error} for rid in run_ids}
    return {rid: found.get(rid, {"ok": False, "error": "not checked"}) for rid in run_ids}


# --- the fresh process ----------------------------------------------------------------------
def _main_reload_check(out: str, run_ids: Sequence[str], *, as_json: bool) -> int:
    runs = read_manifest(out).get("runs") or {}
    ids = list(run_ids) or [rid for rid, v in runs.items() if v.get("status") == "completed"]
    found = reload_check(out, ids)
    if as_json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
    else:
        for rid, res in found.items():
            failure = res["error"] or f"{res['mismatches']} mismatches"
            state = "reproduced" if res["ok"] else f"FAILED: {failure}"
            sys.stdout.write(f"{rid}: {res['rows']} rows {state}\n")
    return 0 if all(r["ok"] for r in found.values()) else 4


def _main_predict(out: str, run_id: str, *, to: str) -> int:
    from gpucampaign.recipes import predict

    ids, X, labels = features_for(out, ids=None)
    model = load_run_model(out, run_id)
    pred, conf = predict(model, X)
    text = _predictions_csv(ids, labels=labels, preds=_tolist(pred), confidence=_tolist(conf))
    if to == "-":
        sys.stdout.write(text)
    else:
        Path(to).write_text(text, encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpucampaign.predictions reload-check|predict ...``"""
    parser = argparse.ArgumentParser(prog="python -m gpucampaign.predictions")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rc = sub.add_parser("reload-check", help="reload models and compare with predictions.csv")
    rc.add_argument("out")
    rc.add_argument("run_ids", nargs="*", help="default: every completed run of the manifest")
    rc.add_argument("--json", action="store_true")
    pr = sub.add_parser("predict", help="reload a model and predict the decision split")
    pr.add_argument("out")
    pr.add_argument("run_id")
    pr.add_argument("--to", default="-", help="CSV file to write (default: stdout)")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "reload-check":
            return _main_reload_check(args.out, args.run_ids, as_json=args.json)
        return _main_predict(args.out, args.run_id, to=args.to)
    except SpecError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
