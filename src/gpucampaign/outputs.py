"""The output folder (R15): written during the campaign, closed with a manifest, then verified.

Layout (DESIGN.md): ``manifest.json``, ``plan.json`` (never rewritten) with ``plan.sha256``,
``spec.yaml``, ``runs/<run_id>/{params.json, metrics.jsonl, predictions.csv,
error_analysis.json, model/}``, ``stops.jsonl``, ``decisions.jsonl``, ``timeline.jsonl``,
``report.md``, ``RELOAD.md``, ``figures/*.png`` and ``data/`` (a corpus copy when small).

``verify_output`` trusts nothing it is not able to check again: sizes and hashes against the
manifest, paths that point into a temporary folder or out of the folder, the plan against the
hash written at the start, and every model reloaded in a fresh process that must reproduce its
``predictions.csv`` exactly on CPU. This module is also that fresh process::

    python -m gpucampaign.outputs reload-check OUT [RUN_ID ...] [--json]
    python -m gpucampaign.outputs predict OUT RUN_ID [--to FILE.csv]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from gpucampaign.files import (
    append_jsonl,
    atomic_write_bytes,
    git_commit,
    json_bytes,
    read_jsonl,
    sha256_file,
    utc_now,
)
from gpucampaign.spec import CampaignSpec, SpecError, load_spec, spec_sha256

MANIFEST = "manifest.json"
PLAN = "plan.json"
PLAN_SHA = "plan.sha256"
SPEC_COPY = "spec.yaml"
RELOAD = "RELOAD.md"
STOPS, DECISIONS, TIMELINE = "stops.jsonl", "decisions.jsonl", "timeline.jsonl"
RUN_FILES = ("params.json", "metrics.jsonl", "predictions.csv", "error_analysis.json")
MODEL_FILES = ("model.safetensors", "config.json")
PREDICTION_COLUMNS = ("id", "label", "prediction", "confidence")
CORPUS_COPY_LIMIT = 50 * 1024 * 1024
MANIFEST_FORMAT = "gpucampaign.manifest/1"
_TEXT_SUFFIXES = {".json", ".jsonl", ".csv", ".md", ".txt", ".yaml", ".yml", ".html", ".sha256", ".toml", ".log"}
_PATH_KEY = re.compile(r"(^|_)(path|paths|dir|dirs|folder|file|files|location)$", re.IGNORECASE)
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class PlanRewriteError(SpecError):
    """``plan.json`` already holds a different plan: the initial plan is never rewritten (R16)."""


# --- the folder -----------------------------------------------------------------------------
class OutputFolder:
    """The campaign's output folder; every path given to it stays inside it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, relative: str) -> Path:
        """``root/relative``, refusing an absolute path or one that climbs out."""
        p = PurePosixPath(str(relative).replace("\\", "/"))
        if not str(relative) or p.is_absolute() or ".." in p.parts:
            raise SpecError(f"'{relative}' must be a relative path inside the output folder", field="out")
        return self.root / Path(*p.parts)

    def run_dir(self, run_id: str) -> Path:
        """``runs/<run_id>/``, created."""
        d = self.path(f"runs/{run_id}")
        d.mkdir(parents=True, exist_ok=True)
        return d

    def write_bytes(self, relative: str, data: bytes) -> Path:
        """Write a file atomically."""
        p = self.path(relative)
        atomic_write_bytes(p, data)
        return p

    def write_text(self, relative: str, text: str) -> Path:
        """Write a UTF-8 text file atomically."""
        return self.write_bytes(relative, text.encode("utf-8"))

    def write_json(self, relative: str, obj: Any) -> Path:
        """Write JSON (indented, sorted keys) atomically."""
        return self.write_bytes(relative, json_bytes(obj))

    def read_json(self, relative: str) -> Any:
        """Parsed JSON, or None when the file does not exist."""
        p = self.path(relative)
        if not p.is_file():
            return None
        return json.loads(p.read_text(encoding="utf-8"))

    def append_jsonl(self, relative: str, record: Mapping[str, Any]) -> None:
        """Append one JSON line and fsync it (stops, decisions, timeline, metrics)."""
        append_jsonl(self.path(relative), record)

    def read_jsonl(self, relative: str) -> list[dict[str, Any]]:
        """All records of a JSON-lines file; [] when it does not exist."""
        return read_jsonl(self.path(relative))

    def record_timeline(
        self,
        step: str | None,
        *,
        phase: str,
        start: datetime | str,
        end: datetime | str,
        run: str | None = None,
        note: str = "",
        kind: str = "machine",
        **extra: Any,
    ) -> dict[str, Any]:
        """Append one observed interval to ``timeline.jsonl`` and return the row.

        Args:
            step: calendar step name the interval belongs to.
            phase: what ran (load, train, eval, save, restore, audit, human...).
            start: start time (aware datetime or ISO string, UTC).
            end: end time.
            run: run name, when the interval belongs to a run.
            note: free text kept with the row.
            kind: "machine" or "human" (human time is only ever observed, never assumed).
            **extra: more fields (e.g. ``steps`` for a train row).
        """
        s = start if isinstance(start, datetime) else datetime.fromisoformat(start)
        e = end if isinstance(end, datetime) else datetime.fromisoformat(end)
        row = {
            "step": step,
            "run": run,
            "phase": phase,
            "kind": kind,
            "start": s.isoformat(timespec="milliseconds"),
            "end": e.isoformat(timespec="milliseconds"),
            "seconds": (e - s).total_seconds(),
            "note": note,
            **extra,
        }
        self.append_jsonl(TIMELINE, row)
        return row

    def copy_in(self, source: str | Path, relative: str) -> Path:
        """Copy a file into the folder (atomic rename)."""
        target = self.path(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.copy.tmp")
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
        return target

    def keep_spec(self, text: bytes, *, source: str, check_only: bool = False) -> None:
        """Keep the campaign's spec as ``spec.yaml``; refuse a folder that holds another one.

        Args:
            text: the spec file's bytes (or the YAML of a spec object).
            source: where the spec comes from, for the error message.
            check_only: only refuse, write nothing (a check before any work starts).

        Raises:
            SpecError: ``spec.yaml`` exists with other content; nothing is changed.
        """
        target = self.path("spec.yaml")
        if target.exists():
            if target.read_bytes() != text:
                raise SpecError(
                    f"Output folder '{self.root}' holds another campaign (its spec.yaml differs from "
                    f"{source}): nothing was changed there; choose a new --out or restore the spec.",
                    field="out",
                )
            return
        if not check_only:
            self.write_bytes("spec.yaml", text)

    def write_plan_once(self, plan: Mapping[str, Any]) -> str:
        """Write ``plan.json`` and ``plan.sha256`` at the start; never rewrite them.

        Writing the same plan again (a resumed campaign) is a no-op.

        Returns:
            The plan's sha256 (of the file's bytes).

        Raises:
            PlanRewriteError: ``plan.json`` exists with different content.
        """
        data = json_bytes(plan)
        digest = hashlib.sha256(data).hexdigest()
        target = self.path(PLAN)
        if target.exists():
            old = sha256_file(target)
            if old != digest:
                raise PlanRewriteError(
                    f"'{target}' already holds another plan (sha256 {old[:12]}...); the initial plan is "
                    "never rewritten: use a new output folder for a new plan",
                    field="out",
                )
            if not self.path(PLAN_SHA).exists():
                self.write_text(PLAN_SHA, f"{digest}  {PLAN}\n")
            return digest
        self.write_bytes(PLAN, data)
        self.write_text(PLAN_SHA, f"{digest}  {PLAN}\n")
        return digest

    def plan_sha256(self) -> str | None:
        """The plan hash recorded at the start (``plan.sha256``), or None."""
        p = self.path(PLAN_SHA)
        if not p.is_file():
            return None
        text = p.read_text(encoding="utf-8").split()
        return text[0] if text else None


# --- environment and corpus reference -------------------------------------------------------
def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect_environment(*, cwd: str | Path | None = None) -> dict[str, Any]:
    """Versions that a reload depends on; no paths, no host names, no credentials."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "gpucampaign": _version("gpucampaign"),
        "torch": _version("torch"),
        "safetensors": _version("safetensors"),
        "numpy": _version("numpy"),
        "scikit-learn": _version("scikit-learn"),
        "prefect": _version("prefect"),
        "git_commit": git_commit(cwd),
    }
    try:
        import torch

        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return env


def reference_corpus(
    root: str | Path,
    corpus_path: str | Path,
    *,
    sha256: str | None = None,
    copy_limit_bytes: int = CORPUS_COPY_LIMIT,
) -> dict[str, Any]:
    """Keep the corpus with the outputs: a copy under ``data/`` when small, else a reference.

    Args:
        root: the output folder.
        corpus_path: the corpus file the campaign used.
        sha256: its pinned hash (checked when given).
        copy_limit_bytes: files below this size are copied (50 MB by default).

    Returns:
        ``{kind: "copied", path: "data/<name>", sha256, size}`` or
        ``{kind: "external", location: "<absolute path>", sha256, size}``.

    Raises:
        SpecError: the file is missing or does not have the pinned hash.
    """
    src = Path(corpus_path)
    if not src.is_file():
        raise SpecError(f"corpus file '{src}' does not exist", field="corpus.path")
    digest = sha256_file(src)
    if sha256 is not None and digest != sha256:
        raise SpecError(
            f"corpus file '{src}' has sha256 {digest}, not the pinned {sha256}", field="corpus.sha256"
        )
    size = src.stat().st_size
    if size < copy_limit_bytes:
        rel = f"data/{src.name}"
        folder = OutputFolder(root)
        if not folder.path(rel).is_file() or sha256_file(folder.path(rel)) != digest:
            folder.copy_in(src, rel)
        return {"kind": "copied", "path": rel, "sha256": digest, "size": size, "name": src.name}
    return {"kind": "external", "location": str(src.resolve()), "sha256": digest, "size": size, "name": src.name}


def corpus_file(root: str | Path, corpus_ref: Mapping[str, Any]) -> Path:
    """The corpus file a manifest's corpus reference points to."""
    if corpus_ref.get("kind") == "copied":
        return OutputFolder(root).path(corpus_ref["path"])
    return Path(corpus_ref["location"])


# --- predictions and error analysis (R1) ----------------------------------------------------
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


def write_predictions(
    run_dir: str | Path,
    *,
    ids: Sequence[Any],
    labels: Sequence[int] | Any,
    preds: Sequence[int] | Any,
    confidence: Sequence[float] | Any,
) -> Path:
    """Write ``predictions.csv`` (id, label, prediction, confidence).

    Confidences are written with ``repr`` of the Python float, so reading the file back gives
    the very same floats: the reload check compares them exactly. Compute them on CPU with the
    run's thread count, as the check will.

    Returns:
        The path written.
    """
    ids_l, labels_l, preds_l, conf_l = _tolist(ids), _tolist(labels), _tolist(preds), _tolist(confidence)
    n = len(ids_l)
    if not (len(labels_l) == len(preds_l) == len(conf_l) == n):
        raise ValueError(
            f"predictions: ids ({n}), labels ({len(labels_l)}), preds ({len(preds_l)}) and confidence "
            f"({len(conf_l)}) must have the same length"
        )
    if n == 0:
        raise ValueError("predictions: no rows to write; an empty predictions file is not an output")
    lines = [",".join(PREDICTION_COLUMNS)]
    for i, y, p, c in zip(ids_l, labels_l, preds_l, conf_l, strict=True):
        lines.append(f"{_csv_cell(str(i))},{int(y)},{int(p)},{float(c)!r}")
    return OutputFolder(run_dir).write_text("predictions.csv", "\n".join(lines) + "\n")


def _csv_cell(s: str) -> str:
    if any(ch in s for ch in ',"\n\r'):
        return '"' + s.replace('"', '""') + '"'
    return s


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
        vs_control}``; ``confusion[i][j]`` counts label ``classes[i]`` predicted as ``classes[j]``;
        ``vs_control`` lists the IDs that flip right->wrong and wrong->right (None without control).
    """
    k = max([*predictions.labels, *predictions.preds]) + 1
    if class_names is not None:
        if len(class_names) < k:
            raise ValueError(f"class_names has {len(class_names)} names but classes go up to {k - 1}")
        k = len(class_names)
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    confusion = [[0] * k for _ in range(k)]
    for y, p in zip(predictions.labels, predictions.preds, strict=True):
        confusion[y][p] += 1
    per_class = []
    f1s = []
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
        if support:
            f1s.append(f1)
        per_class.append(
            {"class": names[c], "support": support, "predicted": predicted, "precision": precision, "recall": recall, "f1": f1}
        )
    n = len(predictions.ids)
    correct = predictions.correct
    errors = [
        {"id": i, "label": y, "prediction": p, "confidence": c}
        for i, y, p, c, ok in zip(
            predictions.ids, predictions.labels, predictions.preds, predictions.confidence, correct, strict=True
        )
        if not ok
    ]
    errors.sort(key=lambda e: (-e["confidence"], e["id"]))
    out: dict[str, Any] = {
        "n": n,
        "accuracy": sum(correct) / n if n else None,
        "macro_f1": sum(f1s) / len(f1s) if f1s else None,
        "errors": len(errors),
        "classes": names,
        "per_class": per_class,
        "confusion": confusion,
        "most_confident_errors": errors[:top_k],
        "vs_control": None,
    }
    if control is not None:
        ctrl = dict(zip(control.ids, control.correct, strict=True))
        right_to_wrong, wrong_to_right = [], []
        for i, ok in zip(predictions.ids, correct, strict=True):
            if i not in ctrl:
                continue
            if ctrl[i] and not ok:
                right_to_wrong.append(i)
            elif not ctrl[i] and ok:
                wrong_to_right.append(i)
        out["vs_control"] = {
            "compared": sum(1 for i in predictions.ids if i in ctrl),
            "missing_in_control": sorted(set(predictions.ids) - set(ctrl)),
            "right_to_wrong": right_to_wrong,
            "wrong_to_right": wrong_to_right,
            "net_gain": len(wrong_to_right) - len(right_to_wrong),
        }
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def render_error_analysis_md(analysis: Mapping[str, Any], *, title: str, max_ids: int = 20) -> str:
    """A short markdown section for one run's error analysis."""
    a = analysis
    lines = [
        f"### {title}",
        "",
        f"{a['n']} predictions, {a['errors']} errors; accuracy {_pct(a['accuracy'])}, macro F1 {_pct(a['macro_f1'])}.",
        "",
        "| class | support | precision | recall |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {c['class']} | {c['support']} | {_pct(c['precision'])} | {_pct(c['recall'])} |" for c in a["per_class"]]
    lines.append("")
    if a["most_confident_errors"]:
        lines.append(
            "Most confident errors: "
            + ", ".join(
                f"`{e['id']}` ({e['label']}->{e['prediction']}, {e['confidence']:.3f})" for e in a["most_confident_errors"]
            )
            + "."
        )
    else:
        lines.append("No errors on this split.")
    vc = a.get("vs_control")
    if vc is not None:

        def ids(xs: Sequence[str]) -> str:
            shown = ", ".join(f"`{x}`" for x in xs[:max_ids])
            more = f" and {len(xs) - max_ids} more" if len(xs) > max_ids else ""
            return (shown + more) if xs else "none"

        lines += [
            "",
            f"Against the control ({vc['compared']} common IDs, net {vc['net_gain']:+d}): "
            f"right->wrong {len(vc['right_to_wrong'])}: {ids(vc['right_to_wrong'])}; "
            f"wrong->right {len(vc['wrong_to_right'])}: {ids(vc['wrong_to_right'])}.",
        ]
    return "\n".join(lines) + "\n"


# --- manifest -------------------------------------------------------------------------------
def list_files(root: str | Path) -> list[str]:
    """Relative posix paths of every file under ``root`` except ``manifest.json``, sorted."""
    base = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames.sort()
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(base).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def _linked_dirs(root: Path) -> list[str]:
    """Relative posix paths of the links to folders under ``root`` (never followed)."""
    out = []
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        out += [(Path(dirpath) / d).relative_to(root).as_posix() for d in dirnames
                if (Path(dirpath) / d).is_symlink()]
    return sorted(out)


def build_manifest(
    root: str | Path,
    *,
    spec: CampaignSpec,
    campaign_id: str,
    expected_runs: Mapping[str, Mapping[str, Any]],
    verdict: Any,
    stops: Sequence[Mapping[str, Any]],
    decisions: Sequence[Mapping[str, Any]],
    budget: Mapping[str, Any],
    environment: Mapping[str, Any],
    corpus_ref: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Write ``manifest.json``: IDs, hashes, runs and statuses, and every file with size and sha256.

    Build it last: it lists every file present (except itself), so anything written after it
    shows up in ``verify_output`` as a file missing from the manifest.

    Args:
        root: the output folder.
        spec: the campaign spec (its sha256 is recorded).
        campaign_id: the campaign's ID.
        expected_runs: ``{run_id: {run, tier, status, stop_id?}}`` for every run of the spec;
            status ``completed`` requires the run's files and a reloadable model.
        verdict: the verdict (``Verdict`` or its dict).
        stops: ``stops.jsonl`` records.
        decisions: ``decisions.jsonl`` records.
        budget: the budget close (``close_budget``).
        environment: ``collect_environment()``.
        corpus_ref: ``reference_corpus()``, None when the spec has no corpus.

    Returns:
        The manifest dict written.

    Raises:
        SpecError: ``plan.sha256`` (written at the start) is missing.
    """
    folder = OutputFolder(root)
    plan_sha = folder.plan_sha256()
    if plan_sha is None:
        raise SpecError(
            f"'{folder.path(PLAN_SHA)}' is missing: the plan must be written with write_plan_once at the start",
            field="out",
        )
    files = []
    for rel in list_files(folder.root):
        p = folder.root / rel
        files.append({"path": rel, "size": p.stat().st_size, "sha256": sha256_file(p)})
    manifest = {
        "format": MANIFEST_FORMAT,
        "campaign_id": campaign_id,
        "campaign": spec.name,
        "question": spec.question,
        "created_at": utc_now(),
        "spec_sha256": spec_sha256(spec),
        "plan_sha256": plan_sha,
        "runs": {rid: dict(v) for rid, v in expected_runs.items()},
        "verdict": verdict.to_dict() if hasattr(verdict, "to_dict") else verdict,
        "stops": list(stops),
        "decisions": list(decisions),
        "budget": dict(budget),
        "environment": dict(environment),
        "corpus": None if corpus_ref is None else dict(corpus_ref),
        "files": files,
    }
    folder.write_json(MANIFEST, manifest)
    return manifest


def write_reload_md(
    root: str | Path,
    *,
    runs: Mapping[str, str],
    corpus_ref: Mapping[str, Any] | None,
    environment: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``RELOAD.md``: the exact commands to check, reload a model and predict.

    Args:
        root: the output folder.
        runs: ``{run_id: run name}`` of the runs with a saved model.
        corpus_ref: ``reference_corpus()`` (copied under data/, or external with its sha256).
        environment: ``collect_environment()``, for the versions to install.
    """
    env = environment or {}
    first = next(iter(runs), "<run_id>")
    if corpus_ref is None:
        corpus_line = "The spec names no corpus."
    elif corpus_ref.get("kind") == "copied":
        corpus_line = (
            f"The corpus is copied in this folder: `{corpus_ref['path']}` (sha256 `{corpus_ref['sha256']}`)."
        )
    else:
        corpus_line = (
            f"The corpus was too large to copy ({corpus_ref['size']} bytes): it stays at "
            f"`{corpus_ref['location']}` (sha256 `{corpus_ref['sha256']}`). Put a copy with that "
            "hash there (or edit nothing else) before reloading; `campaign verify` checks the hash."
        )
    versions = ", ".join(f"{k} {env[k]}" for k in ("python", "torch", "safetensors", "gpucampaign") if env.get(k))
    run_lines = "\n".join(f"- `runs/{rid}/model/` ({name})" for rid, name in runs.items()) or "- (no completed run)"
    text = f"""# Reloading this campaign's models

Everything below runs from this folder, on CPU, with the `gpucampaign` package installed
(`pip install -e <checkout>` of the commit `{env.get('git_commit') or 'unknown'}`).
Recorded versions: {versions or 'see manifest.json'}.

{corpus_line}

Models (safetensors weights, `config.json` with the recipe and versions):

{run_lines}

## 1. Check the whole folder

```bash
campaign verify . --json
```

Exit 0 means every file matches `manifest.json` (size and sha256), no path points into a
temporary folder or out of this folder, `plan.json` is the plan written at the start, and every
model reloaded in a fresh process reproduced its `predictions.csv` exactly.

## 2. Reload one model and compare with its predictions

```bash
python -m gpucampaign.outputs reload-check . {first} --json
```

## 3. Predict with a reloaded model

```bash
python -m gpucampaign.outputs predict . {first} --to predictions-again.csv
```

or in Python:

```python
from gpucampaign.outputs import load_run_model, features_for
from gpucampaign.recipes import predict

model = load_run_model(".", "{first}")           # runs/{first}/model/ on CPU
ids, X, y = features_for(".", ids=None)           # the decision split of the corpus
pred, confidence = predict(model, X)
```
"""
    return OutputFolder(root).write_text(RELOAD, text)


# --- reload in a fresh process --------------------------------------------------------------
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


def _manifest(root: str | Path) -> dict[str, Any]:
    p = Path(root) / MANIFEST
    if not p.is_file():
        raise SpecError(f"'{p}' does not exist: give the output folder of a closed campaign", field="OUT")
    return json.loads(p.read_text(encoding="utf-8"))


def features_for(root: str | Path, *, ids: Sequence[str] | None) -> tuple[list[str], Any, list[int]]:
    """Features of the corpus rows with these IDs (in that order), from the manifest's corpus.

    With ``ids=None``: the rows of the decision split named by the spec's decision rule.

    Returns:
        ``(ids, X, labels)``.
    """
    from gpucampaign.corpus import load_corpus

    folder = OutputFolder(root)
    manifest = _manifest(root)
    spec = load_spec(folder.path(SPEC_COPY))
    if spec.corpus is None or manifest.get("corpus") is None:
        raise SpecError("this campaign has no corpus to predict on", field="corpus")
    path = corpus_file(root, manifest["corpus"])
    corpus = load_corpus(path, corpus_spec=spec.corpus)
    split = spec.decision_rule.split if spec.decision_rule else "test"
    return _rows(corpus, ids=ids, split=split)


def _rows(corpus: Any, *, ids: Sequence[str] | None, split: str) -> tuple[list[str], Any, list[int]]:
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
        raise ValueError(f"{len(missing)} prediction ID(s) are not in the corpus, e.g. {missing[:5]}")
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


def write_run_predictions(root: str | Path, run_id: str, *, corpus: Any, split: str = "test") -> Predictions:
    """Predict ``split`` with the SAVED model of a run, on CPU, and write its ``predictions.csv``.

    Going through the saved ``model/`` folder (not the in-memory model, which may sit on a GPU)
    with the run's thread count is what makes the verifier's fresh-process reload reproduce the
    file exactly. The process's torch thread count is restored afterwards.

    Args:
        root: the output folder.
        run_id: a completed run with ``runs/<run_id>/model/``.
        corpus: the loaded corpus (``gpucampaign.corpus.load_corpus``).
        split: the decision split.

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
        OutputFolder(root).path(f"runs/{run_id}"), ids=[str(i) for i in part.ids.tolist()], labels=part.y,
        preds=pred, confidence=conf,
    )
    return read_predictions(path)


def reload_check(root: str | Path, run_ids: Sequence[str], *, corpus: Any = None) -> dict[str, dict[str, Any]]:
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
        res: dict[str, Any] = {"ok": False, "rows": 0, "mismatches": None, "first_mismatch": None, "error": None}
        out[rid] = res
        try:
            expected = read_predictions(OutputFolder(root).path(f"runs/{rid}/predictions.csv"))
            ids, X, labels = (
                features_for(root, ids=list(expected.ids)) if corpus is None
                else _rows(corpus, ids=list(expected.ids), split="test")
            )
            model = load_run_model(root, rid)
            pred, conf = predict(model, X)
            pred_l, conf_l = [int(v) for v in _tolist(pred)], [float(v) for v in _tolist(conf)]
        except Exception as exc:  # any failure to reload is the finding, reported by name
            res["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            continue
        res["rows"] = len(ids)
        bad = [
            n
            for n in range(len(ids))
            if n >= len(pred_l)
            or pred_l[n] != expected.preds[n]
            or conf_l[n] != expected.confidence[n]
            or labels[n] != expected.labels[n]
        ]
        if len(pred_l) != len(ids):
            res["error"] = f"predict returned {len(pred_l)} rows for {len(ids)} inputs"
        res["mismatches"] = len(bad)
        if bad:
            n = bad[0]
            res["first_mismatch"] = {
                "id": ids[n],
                "expected": {"label": expected.labels[n], "prediction": expected.preds[n], "confidence": expected.confidence[n]},
                "got": {
                    "label": labels[n],
                    "prediction": pred_l[n] if n < len(pred_l) else None,
                    "confidence": conf_l[n] if n < len(conf_l) else None,
                },
            }
        res["ok"] = not bad and res["error"] is None
    return out


def reload_in_fresh_process(
    root: str | Path, run_ids: Sequence[str], *, timeout_s: float = 600
) -> dict[str, dict[str, Any]]:
    """Run ``reload_check`` in a new Python process on CPU and return its findings."""
    if not run_ids:
        return {}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "gpucampaign.outputs", "reload-check", str(Path(root).resolve()), *run_ids, "--json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {rid: {"ok": False, "error": f"the reload process ran past {timeout_s:g} s"} for rid in run_ids}
    try:
        found = json.loads(proc.stdout)
    except json.JSONDecodeError:
        tail = (proc.stderr or proc.stdout)[-800:]
        return {rid: {"ok": False, "error": f"the reload process failed (exit {proc.returncode}): {tail}"} for rid in run_ids}
    return {rid: found.get(rid, {"ok": False, "error": "not checked"}) for rid in run_ids}


# --- verification ---------------------------------------------------------------------------
@dataclass
class Problem:
    """One named defect of an output folder."""

    code: str
    path: str
    detail: str


@dataclass
class VerifyReport:
    """The verdict of ``verify_output``: verified only with no problem at all."""

    verified: bool
    problems: list[Problem] = field(default_factory=list)
    checked_files: int = 0
    reloaded_runs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``campaign verify --json``)."""
        return asdict(self)

    def codes(self) -> set[str]:
        """The problem codes found."""
        return {p.code for p in self.problems}


def _temp_roots() -> list[str]:
    roots = {"/tmp", "/var/tmp", "/dev/shm", "/var/folders", "/private/tmp", "/private/var/folders"}
    for r in (tempfile.gettempdir(), os.environ.get("TMPDIR")):
        if r:
            roots.add(str(Path(r)).rstrip("/") or "/")
    return sorted((r for r in roots if r != "/"), key=len, reverse=True)


def _temp_pattern() -> re.Pattern[str]:
    alts = "|".join(re.escape(r) for r in _temp_roots())
    # Not preceded by a path character, so "runs/x/tmp/y" (a folder named tmp inside OUT) is fine.
    return re.compile(rf"(?<![\w.~/-])(?:{alts})(?=[/\\\"'\s,;:)\]}}>]|$)|AppData[\\/]+Local[\\/]+Temp", re.I)


def _escapes(value: str) -> bool:
    if _URL.match(value) or value.startswith(("#", "data:", "mailto:")):
        return False
    p = PurePosixPath(value.replace("\\", "/"))
    return p.is_absolute() or value.startswith("~") or bool(re.match(r"^[A-Za-z]:", value)) or ".." in p.parts


def _json_path_values(obj: Any, pointer: str = "") -> Iterable[tuple[str, str]]:
    """(JSON pointer, value) of every string under a key that names a path."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            ptr = f"{pointer}/{k}"
            if _PATH_KEY.search(str(k)):
                if isinstance(v, str):
                    yield ptr, v
                elif isinstance(v, list):
                    yield from ((f"{ptr}/{n}", x) for n, x in enumerate(v) if isinstance(x, str))
            if isinstance(v, Mapping | list):
                yield from _json_path_values(v, ptr)
    elif isinstance(obj, list):
        for n, v in enumerate(obj):
            yield from _json_path_values(v, f"{pointer}/{n}")


_MD_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|(?:src|href)=[\"']([^\"']+)[\"']")
_DATA_URI = re.compile(r"data:[^\"')\s]+")


def verify_output(root: str | Path, *, reload: bool = True, timeout_s: float = 600) -> VerifyReport:
    """Check an output folder and name each problem (R15).

    Checks: the manifest lists every file with its size and sha256 (and nothing else); no
    file is empty; JSON files parse; no path points into a temporary folder or out of the
    folder; ``plan.json`` still has the hash written at the start; the spec copy still has
    the recorded hash and every run it defines appears with a status; each ``completed`` run
    has its files and a model; a stopped run's stop is in ``stops.jsonl``; the corpus is there
    with its hash; and (``reload=True``) every model reloads in a fresh process and reproduces
    its ``predictions.csv`` exactly on CPU.

    Problem codes: missing_manifest, invalid_manifest, missing_file, unlisted_file,
    size_mismatch, hash_mismatch, empty_file, invalid_json, temp_path, escaping_path, symlink,
    missing_plan, plan_changed, spec_changed, missing_run, unknown_stop, corpus_missing,
    corpus_mismatch, reload_failed, predictions_mismatch.

    Args:
        root: the output folder.
        reload: also reload every completed run's model in a fresh process.
        timeout_s: limit for the reload process.
    """
    base = Path(root)
    problems: list[Problem] = []

    def add(code: str, path: str, detail: str) -> None:
        problems.append(Problem(code, path, detail))

    if not base.is_dir():
        add("missing_manifest", ".", f"'{base}' is not a folder")
        return VerifyReport(verified=False, problems=problems)

    manifest: dict[str, Any] | None = None
    mpath = base / MANIFEST
    if not mpath.is_file():
        add("missing_manifest", MANIFEST, "no manifest.json: the campaign did not close, or it was removed")
    else:
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
            if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
                raise ValueError("no 'files' list")
        except (ValueError, UnicodeDecodeError) as exc:
            add("invalid_manifest", MANIFEST, f"manifest.json is not a valid manifest: {exc}")
            manifest = None

    present = list_files(base)
    temp_re = _temp_pattern()

    # Every file: links, emptiness, JSON validity, temp and escaping paths. Links to folders
    # are not walked (the walk does not follow them), only named.
    for rel in [*present, *_linked_dirs(base), *([MANIFEST] if mpath.is_file() else [])]:
        p = base / rel
        if p.is_symlink():
            target = os.path.realpath(p)
            inside = Path(target).is_relative_to(base.resolve())
            add("escaping_path" if not inside else "symlink", rel, f"a link to '{target}', not a file")
            continue
        size = p.stat().st_size
        if size == 0:
            add("empty_file", rel, "the file is empty")
            continue
        if p.suffix.lower() not in _TEXT_SUFFIXES:
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            add("invalid_json" if p.suffix in (".json", ".jsonl") else "empty_file", rel, "not UTF-8 text")
            continue
        scan = _DATA_URI.sub("data:", text) if p.suffix.lower() in (".html", ".md") else text
        m = temp_re.search(scan)
        if m:
            line = scan.count("\n", 0, m.start()) + 1
            snippet = scan[m.start(): m.start() + 80].split("\n")[0].split('"')[0]
            add("temp_path", rel, f"line {line} points into a temporary folder: '{snippet}'")
        docs: list[Any] = []
        if p.suffix == ".json":
            try:
                docs = [json.loads(text)]
            except json.JSONDecodeError as exc:
                add("invalid_json", rel, f"not valid JSON: {exc}")
        elif p.suffix == ".jsonl":
            for n, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    add("invalid_json", rel, f"line {n} is not valid JSON: {exc}")
                    break
        elif p.suffix in (".md", ".html"):
            for mm in _MD_LINK.finditer(scan):
                target = mm.group(1) or mm.group(2)
                if target and _escapes(target):
                    add("escaping_path", rel, f"links to '{target}', outside the output folder")
        if p.name == "predictions.csv" and len(text.strip().splitlines()) < 2:
            add("empty_file", rel, "predictions.csv has a header and no prediction row")
        external_ok = (
            rel == MANIFEST
            and manifest is not None
            and isinstance(manifest.get("corpus"), Mapping)
            and manifest["corpus"].get("kind") == "external"
        )
        for doc in docs:
            for ptr, value in _json_path_values(doc):
                if external_ok and ptr == "/corpus/location":
                    continue
                if _escapes(value) and not temp_re.match(value):
                    add("escaping_path", rel, f"{ptr} = '{value}' is absolute or climbs out of the output folder")

    # Manifest against the files present.
    if manifest is not None:
        listed: dict[str, Mapping[str, Any]] = {}
        for entry in manifest["files"]:
            if not isinstance(entry, Mapping):
                add("invalid_manifest", MANIFEST, f"file entry {entry!r} is not an object")
                continue
            rel = str(entry.get("path", ""))
            if _escapes(rel) or not rel:
                add("escaping_path", MANIFEST, f"file entry '{rel}' is absolute or climbs out of the output folder")
                continue
            listed[rel] = entry
        for rel in sorted(set(listed) - set(present)):
            add("missing_file", rel, "listed in manifest.json but absent")
        for rel in sorted(set(present) - set(listed)):
            add("unlisted_file", rel, "present but not listed in manifest.json")
        for rel in sorted(set(listed) & set(present)):
            p, entry = base / rel, listed[rel]
            if p.is_symlink():
                continue
            size = p.stat().st_size
            if size != entry.get("size"):
                add("size_mismatch", rel, f"{size} bytes, manifest says {entry.get('size')}")
            elif sha256_file(p) != entry.get("sha256"):
                add("hash_mismatch", rel, f"sha256 differs from the manifest's {str(entry.get('sha256'))[:12]}...")

    # The plan written at the start.
    folder = OutputFolder(base)
    recorded = folder.plan_sha256()
    if not (base / PLAN).is_file():
        add("missing_plan", PLAN, "plan.json is missing")
    elif recorded is None:
        add("missing_plan", PLAN_SHA, "plan.sha256 (the plan's hash written at the start) is missing")
    else:
        actual = sha256_file(base / PLAN)
        if actual != recorded:
            add("plan_changed", PLAN, f"sha256 {actual[:12]}... differs from {recorded[:12]}... written at the start")
        if manifest is not None and manifest.get("plan_sha256") != recorded:
            add("plan_changed", MANIFEST, "plan_sha256 in the manifest differs from plan.sha256 written at the start")

    if manifest is None:
        return VerifyReport(verified=False, problems=problems, checked_files=len(present))

    # Expected runs: the spec's runs, each with a status; completed runs with their files.
    runs: dict[str, Mapping[str, Any]] = manifest.get("runs") or {}
    if not isinstance(runs, Mapping):
        add("invalid_manifest", MANIFEST, "'runs' is not an object")
        runs = {}
    if (base / SPEC_COPY).is_file():
        try:
            spec = load_spec(base / SPEC_COPY)
        except SpecError as exc:
            add("spec_changed", SPEC_COPY, f"spec.yaml no longer loads: {exc}")
        else:
            if manifest.get("spec_sha256") != spec_sha256(spec):
                add("spec_changed", SPEC_COPY, "the spec's sha256 differs from the manifest's spec_sha256")
            for name in spec.run_names() if spec.control is not None else []:
                rid = spec.run_id(name)
                if rid not in runs:
                    add("missing_run", f"runs/{rid}", f"run '{name}' ({rid}) of the spec is not in the manifest")
    else:
        add("missing_file", SPEC_COPY, "spec.yaml (the campaign's spec) is missing")

    stop_ids = {r.get("stop_id") for r in folder.read_jsonl(STOPS)} if (base / STOPS).is_file() else set()
    to_reload = []
    for rid, info in runs.items():
        rdir = f"runs/{rid}"
        if not isinstance(info, Mapping):
            add("invalid_manifest", MANIFEST, f"run {rid!r} is not an object")
            continue
        if "/" in rid or "\\" in rid or rid in ("", ".", ".."):
            add("escaping_path", MANIFEST, f"run ID {rid!r} is not a folder name inside runs/")
            continue
        status = info.get("status")
        if info.get("stop_id") and info["stop_id"] not in stop_ids:
            add("unknown_stop", rdir, f"stop {info['stop_id']} of run {rid} is not in stops.jsonl")
        if status != "completed":
            continue
        if not (base / rdir).is_dir():
            add("missing_run", rdir, f"expected run {rid} ({info.get('run')}) is completed but its folder is missing")
            continue
        lacking = [f for f in RUN_FILES if not (base / rdir / f).is_file()]
        lacking += [f"model/{f}" for f in MODEL_FILES if not (base / rdir / "model" / f).is_file()]
        for f in lacking:
            add("missing_file", f"{rdir}/{f}", f"completed run {rid} lacks {f}")
        if not any(f == "predictions.csv" or f.startswith("model/") for f in lacking):
            to_reload.append(rid)

    # The corpus the predictions came from.
    corpus = manifest.get("corpus")
    if isinstance(corpus, Mapping):
        if corpus.get("kind") == "copied":
            cp = base / str(corpus.get("path", ""))
            if _escapes(str(corpus.get("path", ""))):
                pass  # already named as an escaping path
            elif not cp.is_file():
                add("corpus_missing", str(corpus.get("path")), "the corpus copy is missing")
            elif sha256_file(cp) != corpus.get("sha256"):
                add("corpus_mismatch", str(corpus.get("path")), "the corpus copy's sha256 differs from the manifest")
        else:
            # A temporary location is already named by the scan of manifest.json above.
            loc = str(corpus.get("location", ""))
            if not Path(loc).is_file():
                add("corpus_missing", MANIFEST, f"the external corpus '{loc}' is missing")
            elif sha256_file(loc) != corpus.get("sha256"):
                add("corpus_mismatch", MANIFEST, f"the external corpus '{loc}' does not have the recorded sha256")

    reloaded: list[str] = []
    if reload and to_reload:
        for rid, res in reload_in_fresh_process(base, to_reload, timeout_s=timeout_s).items():
            if res.get("ok"):
                reloaded.append(rid)
            elif res.get("error"):
                add("reload_failed", f"runs/{rid}/model", f"the model does not reload in a fresh process: {res['error']}")
            else:
                fm = res.get("first_mismatch") or {}
                add(
                    "predictions_mismatch",
                    f"runs/{rid}/predictions.csv",
                    f"the reloaded model differs on {res.get('mismatches')} of {res.get('rows')} rows "
                    f"(first: id {fm.get('id')}: expected {fm.get('expected')}, got {fm.get('got')})",
                )
    return VerifyReport(verified=not problems, problems=problems, checked_files=len(present), reloaded_runs=reloaded)


# --- the fresh process ----------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpucampaign.outputs reload-check|predict ...``"""
    parser = argparse.ArgumentParser(prog="python -m gpucampaign.outputs")
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
            ids = args.run_ids or [
                rid for rid, v in (_manifest(args.out).get("runs") or {}).items() if v.get("status") == "completed"
            ]
            found = reload_check(args.out, ids)
            if args.json:
                sys.stdout.write(json.dumps(found, indent=2) + "\n")
            else:
                for rid, res in found.items():
                    state = "reproduced" if res["ok"] else f"FAILED: {res['error'] or str(res['mismatches']) + ' mismatches'}"
                    sys.stdout.write(f"{rid}: {res['rows']} rows {state}\n")
            return 0 if all(r["ok"] for r in found.values()) else 4
        from gpucampaign.recipes import predict

        ids, X, labels = features_for(args.out, ids=None)
        model = load_run_model(args.out, args.run_id)
        pred, conf = predict(model, X)
        lines = [",".join(PREDICTION_COLUMNS)] + [
            f"{_csv_cell(i)},{y},{int(p)},{float(c)!r}"
            for i, y, p, c in zip(ids, labels, _tolist(pred), _tolist(conf), strict=True)
        ]
        text = "\n".join(lines) + "\n"
        if args.to == "-":
            sys.stdout.write(text)
        else:
            Path(args.to).write_text(text, encoding="utf-8")
        return 0
    except SpecError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
