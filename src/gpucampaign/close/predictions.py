"""Predictions on the decision split, and reloading a saved model (their error analysis: see
``error_analysis``).

Each completed run writes ``predictions.csv`` from its SAVED model on CPU; a reload in a fresh
process must reproduce that file exactly. This module is also that fresh process::

    python -m gpucampaign.predictions reload-check OUT [RUN_ID ...] [--json] [--trust-folder-code]
    python -m gpucampaign.predictions predict OUT RUN_ID [--to FILE.csv] [--trust-folder-code]

A user's recipe is imported from the copy kept in the folder only with ``--trust-folder-code``
(``verify`` passes it for an anchored manifest); nothing of the folder is on ``sys.path``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpucampaign.close.error_analysis import Predictions
from gpucampaign.config import BUILTIN_RECIPES, SpecError, load_spec
from gpucampaign.core.errors import ArgumentError, InputError
from gpucampaign.core.files import csv_text, sha256_file
from gpucampaign.data.corpus import load_corpus
from gpucampaign.folder.layout import (
    PREDICTIONS_FILE,
    PREDICTIONS_PREFIX,
    SPEC_COPY,
    OutputFolder,
    corpus_file,
    is_live_progress,
    model_config,
    read_manifest,
    run_relpath,
)
from gpucampaign.modelfolder import RecipeCodeNotTrusted, load_run_model, predict
from gpucampaign.modelfolder.recipe_reload import recipe_reload_check, recorded_split
from gpucampaign.modelfolder.reload import decision_rows, load_model

PREDICTION_COLUMNS = ("id", "label", "prediction", "confidence")


def predictions_file(split: str, *, report_split: str) -> str:
    """The file of a run's predictions on ``split``: ``predictions.csv`` on the report split
    (the one the reload check reproduces), ``predictions-<split>.csv`` on another split."""
    return PREDICTIONS_FILE if split == report_split else f"{PREDICTIONS_PREFIX}{split}.csv"


def _tolist(x: Any) -> list[Any]:
    if hasattr(x, "detach"):
        x = x.detach().cpu()
    if hasattr(x, "tolist"):
        return list(x.tolist())
    return list(x)


def _predictions_csv(
    ids: Sequence[Any], *, labels: Sequence[Any], preds: Sequence[Any], confidence: Sequence[Any]
) -> str:
    """The CSV text; ``repr`` of each float confidence, so a read gives back the same floats."""
    rows = [
        {"id": str(i), "label": int(y), "prediction": int(p), "confidence": float(c)}
        for i, y, p, c in zip(ids, labels, preds, confidence, strict=True)
    ]
    return csv_text(rows, columns=PREDICTION_COLUMNS)


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


# --- reloading a saved model ----------------------------------------------------------------
def features_for(
    root: str | Path, *, ids: Sequence[str] | None
) -> tuple[list[str], Any, list[int]]:
    """Features of the corpus rows with these IDs (in that order), from the manifest's corpus.

    With ``ids=None``: the rows of the decision split named by the spec's decision rule.

    Returns:
        ``(ids, X, labels)``.
    """
    manifest = read_manifest(root)
    # The folder is never put on sys.path: none of its files is importable code.
    spec = load_spec(OutputFolder(root).path(SPEC_COPY), recipe_folder=False)
    if spec.corpus is None or manifest.get("corpus") is None:
        raise SpecError("this campaign has no corpus to predict on", field="corpus")
    corpus = load_corpus(corpus_file(root, manifest["corpus"]), corpus_spec=spec.corpus)
    return _rows(corpus, ids=ids, split=spec.decision_split)


def _rows(
    corpus: Any, *, ids: Sequence[str] | None, split: str
) -> tuple[list[str], Any, list[int]]:
    """Rows of a loaded corpus by ID, whatever split they are in (or a whole split)."""
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
        corpus: the loaded corpus (``gpucampaign.data.corpus.load_corpus``).
        split: the split to predict (the decision split for ``predictions.csv``).
        name: the file name inside ``runs/<run_id>/``.

    Returns:
        The predictions written.
    """
    threads = torch.get_num_threads()
    try:
        model = load_run_model(root, run_id)
        part = corpus.split(split)
        pred, conf = predict(model, part.X)
    finally:
        torch.set_num_threads(threads)
    path = write_predictions(
        OutputFolder(root).path(run_relpath(run_id)),
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
    root: str | Path, run_ids: Sequence[str], *, corpus: Any = None, trust_folder_code: bool = False
) -> dict[str, dict[str, Any]]:
    """Reload each run's model here and compare its predictions with ``predictions.csv``.

    Meant to run in a fresh process (see ``verify_output``). Exactly equal means the same
    predicted class and the same float confidence on every row. ``corpus``: the loaded corpus,
    before the manifest that names it exists; by default the manifest's corpus is read. A
    user's recipe is imported from the copy kept in the folder only with
    ``trust_folder_code``; otherwise as installed or from a spec's folder with the recorded
    sha256, and when there is none the run is ``skipped`` (its reason), not failed.

    Returns:
        ``{run_id: {ok, rows, mismatches, first_mismatch, error, skipped}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for rid in run_ids:
        res: dict[str, Any] = {
            "ok": False,
            "rows": 0,
            "mismatches": None,
            "first_mismatch": None,
            "error": None,
            "skipped": None,
        }
        out[rid] = res
        # The close checks its own fresh folder (it passes the corpus); any other reload reads
        # a sealed folder, and only the files it sealed are trusted.
        if corpus is None and (unsealed := _unsealed_run_files(root, rid)):
            res["error"] = f"not reloaded: its files are not the ones sealed ({unsealed})"
            continue
        if not _builtin_model(root, rid):
            res.update(_recipe_check(root, rid, corpus=corpus, trust=trust_folder_code))
            continue
        try:
            expected = read_predictions(OutputFolder(root).path(run_relpath(rid, PREDICTIONS_FILE)))
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


def _unsealed_run_files(root: str | Path, run_id: str) -> str:
    """What differs between a run's folder and the folder's manifest ('' when it agrees, or
    when there is no manifest yet): checked here, in the process that reloads, right before
    anything of the run is imported or read as tensors."""
    folder = OutputFolder(root)
    try:
        listed = {
            e["path"]: e
            for e in read_manifest(root).get("files", [])
            if isinstance(e, Mapping) and str(e.get("path", "")).startswith(run_relpath(run_id, ""))
        }
    except InputError:
        return ""  # before the seal (the close's own check): nothing to compare with
    except (ValueError, TypeError, AttributeError):
        return "manifest.json is not a valid manifest"
    run_dir = folder.path(run_relpath(run_id))
    present = {
        rel
        for p in run_dir.rglob("*")
        if not p.is_dir() and not is_live_progress(rel := p.relative_to(folder.root).as_posix())
    }
    wrong = sorted(set(listed) ^ present)
    wrong += [
        rel
        for rel in sorted(set(listed) & present)
        if (folder.root / rel).is_symlink()
        or (folder.root / rel).stat().st_size != listed[rel].get("size")
        or sha256_file(folder.root / rel) != listed[rel].get("sha256")
    ]
    return ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")


def _builtin_model(root: str | Path, run_id: str) -> bool:
    """True unless the run's model ``config.json`` names a user's recipe."""
    try:
        info = OutputFolder(root).read_json(model_config(run_id))
    except (OSError, ValueError):
        return True  # the builtin path reports the unreadable folder by name
    return not isinstance(info, Mapping) or info.get("recipe", "mlp") in BUILTIN_RECIPES


def _recipe_check(root: str | Path, run_id: str, *, corpus: Any, trust: bool) -> dict[str, Any]:
    """``recipe_reload_check``, with any failure reported as the finding (and a recipe whose
    only code is the folder's untrusted copy as skipped, with why)."""
    try:
        return recipe_reload_check(root, run_id, corpus=corpus, trust_folder_code=trust)
    except RecipeCodeNotTrusted as exc:
        return {"ok": False, "skipped": str(exc), "found": exc.found}
    except Exception as exc:  # any failure to reload is the finding, reported by name
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000]}


def reload_in_fresh_process(
    root: str | Path,
    run_ids: Sequence[str],
    *,
    timeout_s: float = 600,
    trust_folder_code: bool = False,
    recipe_dirs: Sequence[str | Path] = (),
) -> dict[str, dict[str, Any]]:
    """Run ``reload_check`` in a new Python process on CPU and return its findings.

    ``recipe_dirs``: folders of trusted recipe files (a spec's folder), put first on the new
    process's ``sys.path``; ``trust_folder_code``: see ``reload_check``. The process does not
    put its working folder on ``sys.path`` (``-P`` and ``PYTHONSAFEPATH``, no empty
    ``PYTHONPATH`` entry): verifying from inside an output folder imports nothing of it, even
    were the package's own guard (``gpucampaign.__init__``) gone.
    """
    if not run_ids:
        return {}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONSAFEPATH": "1"}
    dirs = [str(Path(d).resolve()) for d in recipe_dirs]
    # An empty PYTHONPATH entry is the working folder: the child gets only named folders.
    given = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.pop("PYTHONPATH", None)
    if dirs or given:
        env["PYTHONPATH"] = os.pathsep.join([*dirs, *given])
    cmd = [
        sys.executable,
        "-P",
        "-m",
        "gpucampaign.close.predictions",
        "reload-check",
        str(Path(root).resolve()),
        *run_ids,
        "--json",
        *(["--trust-folder-code"] if trust_folder_code else []),
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
INPUT_HELP = (
    "New input of the corpus's kind (a file, or a folder the recipe reads): every split the "
    "recipe makes of it is predicted, each row keyed by its example's ID"
)
RECIPES_HELP = (
    "A folder of your recipe files (the spec's folder): imported when the recipe's file has "
    "the sha256 recorded with the model"
)
TRUST_HELP = (
    "Import a user's recipe from the copy kept in the output folder. Only for a folder whose "
    "manifest you checked (`campaign verify OUT --expect SHA256`) or whose source you trust; "
    "without it the recipe is imported as installed or from a spec's folder on PYTHONPATH."
)


def _main_reload_check(
    out: str, run_ids: Sequence[str], *, as_json: bool, trust_folder_code: bool
) -> int:
    runs = read_manifest(out).get("runs") or {}
    ids = list(run_ids) or [rid for rid, v in runs.items() if v.get("status") == "completed"]
    found = reload_check(out, ids, trust_folder_code=trust_folder_code)
    if as_json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
    else:
        for rid, res in found.items():
            failure = res.get("error") or f"{res.get('mismatches')} mismatches"
            state = "reproduced" if res["ok"] else f"FAILED: {failure}"
            if res.get("skipped"):
                state = f"SKIPPED: {res['skipped']}"
            sys.stdout.write(f"{rid}: {res.get('rows', 0)} rows {state}\n")
    return 0 if all(r["ok"] for r in found.values()) else 4


def predict_command(
    out: str | Path,
    run: str,
    *,
    to: str,
    input_path: str | Path | None = None,
    splits: Sequence[str] | None = None,
    trust_folder_code: bool = False,
    recipes: Sequence[str | Path] = (),
    force: bool = False,
) -> int:
    """Reload ``run`` (its name or ID) and write its predictions as CSV at ``to`` (``-``:
    stdout), keyed by example ID: of ``input_path`` (new input of the corpus's kind) when
    given, else of the campaign's own decision split (the rows of ``predictions.csv``).
    ``force``: overwrite an existing ``to``. The paths are checked first (``check_paths``).

    Returns:
        The number of rows written.
    """
    check_paths(out, to=to, input_path=input_path, force=force)
    loaded = load_model(out, run, trust_folder_code=trust_folder_code, recipes=recipes)
    if input_path is not None:
        text = csv_text(loaded.predict(input_path, splits=splits))
    elif loaded.builtin:
        ids, X, labels = features_for(out, ids=None)
        pred, conf = predict(loaded.model, X)
        text = _predictions_csv(ids, labels=labels, preds=_tolist(pred), confidence=_tolist(conf))
    else:
        text = csv_text(decision_rows(loaded, split=recorded_split(out, loaded.run_id)))
    if to == "-":
        sys.stdout.write(text)
    else:
        Path(to).write_text(text, encoding="utf-8")
    return max(0, len(text.splitlines()) - 1)


#: The most bytes of new input ``predict`` reads (a file, or a folder's files together).
MAX_INPUT_BYTES = 2 << 30


def check_paths(
    out: str | Path, *, to: str, input_path: str | Path | None, force: bool = False
) -> None:
    """Refuse, before anything is loaded, what ``predict`` must not read or write: ``--to``
    inside the output folder (its files are sealed), a folder, or an existing file without
    ``force``; ``--input`` that is not a regular file or a folder of regular files (a FIFO
    or a device would block or never end), or over ``MAX_INPUT_BYTES``.

    Raises:
        ArgumentError: One paragraph naming the option and the fix.
    """
    if to != "-":
        target = Path(to)
        if target.resolve().is_relative_to(Path(out).resolve()):
            raise ArgumentError(
                f"--to '{to}' is inside the output folder, whose files are sealed: write the "
                "predictions elsewhere.",
                field="--to",
            )
        if target.is_dir() or (target.exists() and not force):
            what = "a folder" if target.is_dir() else "an existing file"
            raise ArgumentError(
                f"--to '{to}' is {what}: give a new file's path"
                + ("." if target.is_dir() else ", or --force to overwrite it."),
                field="--to",
            )
    if input_path is None:
        return
    src = Path(input_path)
    if not src.exists():
        return  # said by the reload's own check, naming the option
    files = sorted(p for p in src.rglob("*") if not p.is_dir()) if src.is_dir() else [src]
    total = 0
    for f in files:
        try:
            st = f.stat()  # a link to a file is that file
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise ArgumentError(
                f"--input '{input_path}': '{f}' is not a regular file (a FIFO, a device, a "
                "socket or a broken link is never read): give a file or a folder of files.",
                field="--input",
            )
        total += st.st_size
    if total > MAX_INPUT_BYTES:
        raise ArgumentError(
            f"--input '{input_path}' holds {total} bytes, over the {MAX_INPUT_BYTES} bytes "
            "predict reads at once: split it into smaller files and predict each.",
            field="--input",
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpucampaign.predictions reload-check|predict ...``"""
    parser = argparse.ArgumentParser(prog="python -m gpucampaign.predictions")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rc = sub.add_parser("reload-check", help="reload models and compare with predictions.csv")
    rc.add_argument("out")
    rc.add_argument("run_ids", nargs="*", help="default: every completed run of the manifest")
    rc.add_argument("--json", action="store_true")
    pr = sub.add_parser(
        "predict", help="reload a model and predict (new input or the decision split)"
    )
    pr.add_argument("out")
    pr.add_argument("run_id", help="the run's name in the spec or its run ID")
    pr.add_argument("--to", default="-", help="CSV file to write (default: stdout)")
    pr.add_argument("--input", default=None, help=INPUT_HELP)
    pr.add_argument("--split", action="append", default=None, help="only this split of --input")
    pr.add_argument("--recipes", action="append", default=[], metavar="DIR", help=RECIPES_HELP)
    pr.add_argument("--force", action="store_true", help="overwrite an existing --to file")
    for p in (rc, pr):
        p.add_argument("--trust-folder-code", action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    trust = args.trust_folder_code
    try:
        if args.cmd == "reload-check":
            return _main_reload_check(
                args.out, args.run_ids, as_json=args.json, trust_folder_code=trust
            )
        predict_command(
            args.out,
            args.run_id,
            to=args.to,
            input_path=args.input,
            splits=args.split,
            trust_folder_code=trust,
            recipes=args.recipes,
            force=args.force,
        )
        return 0
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
