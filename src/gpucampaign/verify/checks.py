"""Verify a closed output folder: one function per check, each naming its problems.

``verify_output`` trusts nothing it is not able to check again: sizes and hashes against the
manifest, paths that point into a temporary folder or out of the folder, the plan against the
hash written at the start, and every model reloaded in a fresh process that must reproduce its
``predictions.csv`` exactly on CPU.

A manifest rewritten to match changed files is caught only against its own sha256 kept outside
the folder (``expect``, printed at the close). So no code of the folder runs by default: a
user's recipe is imported as installed or from a spec's folder with the recorded sha256, and
the copy kept in the folder only when the manifest is anchored or the user trusts it; when
neither is there, that model's reload is skipped and said.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gpucampaign.close.ledger import (
    LedgerError,
    parse_ledger,
    read_ledger_bytes,
    sealed_prefix_intact,
)
from gpucampaign.close.predictions import reload_in_fresh_process
from gpucampaign.config import CampaignSpec, TrackingSpec, load_spec, spec_sha256
from gpucampaign.core.errors import InputError
from gpucampaign.core.files import sha256_bytes, sha256_file
from gpucampaign.data.pins import input_sha256
from gpucampaign.folder.layout import (
    LEDGER_FILE,
    MANIFEST,
    MODEL_DIR,
    MODEL_FILES,
    PLAN,
    PLAN_SHA,
    PREDICTIONS_FILE,
    RUN_FILES,
    SPEC_COPY,
    STOPS,
    OutputFolder,
    run_path,
    run_relpath,
)
from gpucampaign.verify.context import Problem, VerifyContext, run_id_is_a_name
from gpucampaign.verify.private import private_copy
from gpucampaign.verify.timeline import check_timeline
from gpucampaign.verify.verdict import check_verdict

_PATH_KEY = re.compile(r"(^|_)(path|paths|dir|dirs|folder|file|files|location)$", re.IGNORECASE)
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_MD_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|(?:src|href)=[\"']([^\"']+)[\"']")


@dataclass
class VerifyReport:
    """The verdict of ``verify_output``: verified only with no problem at all."""

    verified: bool
    problems: list[Problem] = field(default_factory=list)
    checked_files: int = 0
    reloaded_runs: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    manifest_sha256: str | None = None
    anchored: bool | None = None
    folder_code_trusted: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``campaign verify --json``)."""
        return asdict(self)

    def codes(self) -> set[str]:
        """The problem codes found."""
        return {p.code for p in self.problems}


# --- paths ----------------------------------------------------------------------------------
def _escapes(value: str) -> bool:
    if _URL.match(value) or value.startswith(("#", "data:", "mailto:")):
        return False
    p = PurePosixPath(value.replace("\\", "/"))
    return (
        p.is_absolute()
        or value.startswith("~")
        or bool(re.match(r"^[A-Za-z]:", value))
        or ".." in p.parts
    )


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


# --- the checks -----------------------------------------------------------------------------
def check_manifest_readable(ctx: VerifyContext) -> list[Problem]:
    """``manifest.json`` exists and has a list of files."""
    if not (ctx.base / MANIFEST).is_file():
        detail = "no manifest.json: the campaign did not close, or it was removed"
        return [Problem("missing_manifest", MANIFEST, detail)]
    if ctx.manifest is None:
        detail = f"manifest.json is not a valid manifest: {ctx.manifest_error}"
        return [Problem("invalid_manifest", MANIFEST, detail)]
    return []


def check_anchor(ctx: VerifyContext) -> list[Problem]:
    """``manifest.json`` has the sha256 kept outside the folder (``--expect``), when given."""
    actual = ctx.manifest_sha256()
    if ctx.expect is None or actual is None or actual == ctx.expect:
        return []
    detail = (
        f"manifest.json has sha256 {actual}, not the expected {ctx.expect} (--expect): the "
        "folder is not the one sealed at the close"
    )
    return [Problem("manifest_not_anchored", MANIFEST, detail)]


def check_links(ctx: VerifyContext) -> list[Problem]:
    """No file is a link; a link out of the folder is an escaping path."""
    problems = []
    for rel in ctx.scanned():
        p = ctx.base / rel
        if p.is_symlink():
            target = os.path.realpath(p)
            inside = Path(target).is_relative_to(ctx.base.resolve())
            code = "symlink" if inside else "escaping_path"
            problems.append(Problem(code, rel, f"a link to '{target}', not a file"))
    return problems


def _rows_after_header(text: str | None) -> int | None:
    return None if text is None else max(len(text.strip().splitlines()) - 1, 0)


def check_empty_files(ctx: VerifyContext) -> list[Problem]:
    """No file is empty, no text file is undecodable, every predictions.csv has a row."""
    problems = []
    for rel in ctx.scanned():
        p = ctx.base / rel
        if p.is_symlink():
            continue
        if p.stat().st_size == 0:
            problems.append(Problem("empty_file", rel, "the file is empty"))
        elif ctx.undecodable(rel) and p.suffix not in (".json", ".jsonl"):
            problems.append(Problem("empty_file", rel, "not UTF-8 text"))
        elif p.name == PREDICTIONS_FILE and _rows_after_header(ctx.text(rel)) == 0:
            detail = "predictions.csv has a header and no prediction row"
            problems.append(Problem("empty_file", rel, detail))
    return problems


def check_json(ctx: VerifyContext) -> list[Problem]:
    """Every ``.json`` file parses, and every line of every ``.jsonl`` file."""
    problems = []
    for rel in ctx.scanned():
        if Path(rel).suffix not in (".json", ".jsonl") or not ctx.regular(rel):
            continue
        if ctx.undecodable(rel):
            problems.append(Problem("invalid_json", rel, "not UTF-8 text"))
            continue
        _, error = ctx.json_docs(rel)
        if error:
            problems.append(Problem("invalid_json", rel, error))
    return problems


def check_temp_paths(ctx: VerifyContext) -> list[Problem]:
    """No text file points into a temporary folder (the first such place of each is named)."""
    problems = []
    for rel in ctx.scanned():
        scan = ctx.scan_text(rel)
        if scan is None:
            continue
        m = ctx.temp_re.search(scan)
        if m:
            line = scan.count("\n", 0, m.start()) + 1
            snippet = scan[m.start() : m.start() + 80].split("\n")[0].split('"')[0]
            detail = f"line {line} points into a temporary folder: '{snippet}'"
            problems.append(Problem("temp_path", rel, detail))
    return problems


def _external_corpus(manifest: Mapping[str, Any] | None) -> bool:
    corpus = (manifest or {}).get("corpus")
    return isinstance(corpus, Mapping) and corpus.get("kind") == "external"


def check_escaping_paths(ctx: VerifyContext) -> list[Problem]:
    """No markdown/HTML link and no JSON path value is absolute or climbs out of the folder.

    A value in a temporary folder is named by ``check_temp_paths`` instead; the manifest's
    external corpus location is the one absolute path allowed.
    """
    problems = []
    for rel in ctx.scanned():
        scan = ctx.scan_text(rel)
        if scan is not None and Path(rel).suffix in (".md", ".html"):
            for mm in _MD_LINK.finditer(scan):
                target = mm.group(1) or mm.group(2)
                if target and _escapes(target):
                    detail = f"links to '{target}', outside the output folder"
                    problems.append(Problem("escaping_path", rel, detail))
        external_ok = rel == MANIFEST and _external_corpus(ctx.manifest)
        for doc in ctx.json_docs(rel)[0]:
            for ptr, value in _json_path_values(doc):
                if external_ok and ptr == "/corpus/location":
                    continue
                if _escapes(value) and not ctx.temp_re.match(value):
                    detail = f"{ptr} = '{value}' is absolute or climbs out of the output folder"
                    problems.append(Problem("escaping_path", rel, detail))
    return problems


def check_manifest_files(ctx: VerifyContext) -> list[Problem]:
    """The manifest lists every file present, each with its size and sha256, and no other."""
    if ctx.manifest is None:
        return []
    problems = []
    listed: dict[str, Mapping[str, Any]] = {}
    for entry in ctx.manifest["files"]:
        if not isinstance(entry, Mapping):
            detail = f"file entry {entry!r} is not an object"
            problems.append(Problem("invalid_manifest", MANIFEST, detail))
            continue
        rel = str(entry.get("path", ""))
        if _escapes(rel) or not rel:
            detail = f"file entry '{rel}' is absolute or climbs out of the output folder"
            problems.append(Problem("escaping_path", MANIFEST, detail))
            continue
        listed[rel] = entry
    present = set(ctx.present)
    for rel in sorted(set(listed) - present):
        problems.append(Problem("missing_file", rel, "listed in manifest.json but absent"))
    for rel in sorted(present - set(listed)):
        if rel == LEDGER_FILE and _ledger_grew(ctx.base / rel, size=0, sha256=sha256_bytes(b"")):
            continue  # a ledger started after the seal: growth from nothing
        problems.append(Problem("unlisted_file", rel, "present but not listed in manifest.json"))
    for rel in sorted(set(listed) & present):
        p, entry = ctx.base / rel, listed[rel]
        if p.is_symlink():
            continue
        if rel == LEDGER_FILE and _ledger_grew(
            p, size=entry.get("size"), sha256=entry.get("sha256")
        ):
            continue
        size = p.stat().st_size
        if size != entry.get("size"):
            detail = f"{size} bytes, manifest says {entry.get('size')}"
            problems.append(Problem("size_mismatch", rel, detail))
        elif sha256_file(p) != entry.get("sha256"):
            detail = f"sha256 differs from the manifest's {str(entry.get('sha256'))[:12]}..."
            problems.append(Problem("hash_mismatch", rel, detail))
    if LEDGER_FILE in present and not (ctx.base / LEDGER_FILE).is_symlink():
        try:  # its growth after the seal is not hashed: every line must still be an expense
            parse_ledger(read_ledger_bytes(ctx.base / LEDGER_FILE) or b"", where=LEDGER_FILE)
        except LedgerError as exc:
            problems.append(Problem("invalid_ledger", LEDGER_FILE, str(exc)))
    return problems


def _ledger_grew(path: Path, *, size: Any, sha256: Any) -> bool:
    """The ledger only had expenses appended after the seal: its sealed bytes are intact."""
    if not isinstance(size, int) or not isinstance(sha256, str) or path.is_symlink():
        return False
    try:
        data = read_ledger_bytes(path)
    except LedgerError:  # a FIFO or a device in its place: named by the ledger's own check
        return False
    return data is not None and sealed_prefix_intact(data, size=size, sha256=sha256)


def check_plan_hash(ctx: VerifyContext) -> list[Problem]:
    """``plan.json`` still has the hash written at the start, and the manifest agrees."""
    try:
        recorded = OutputFolder(ctx.base).plan_sha256()
    except InputError:
        return []  # plan.sha256 is a link out of the folder, named by check_links
    if not (ctx.base / PLAN).is_file():
        return [Problem("missing_plan", PLAN, "plan.json is missing")]
    if recorded is None:
        detail = "plan.sha256 (the plan's hash written at the start) is missing"
        return [Problem("missing_plan", PLAN_SHA, detail)]
    problems = []
    actual = sha256_file(ctx.base / PLAN)
    if actual != recorded:
        detail = f"sha256 {actual[:12]}... differs from {recorded[:12]}... written at the start"
        problems.append(Problem("plan_changed", PLAN, detail))
    if ctx.manifest is not None and ctx.manifest.get("plan_sha256") != recorded:
        detail = "plan_sha256 in the manifest differs from plan.sha256 written at the start"
        problems.append(Problem("plan_changed", MANIFEST, detail))
    return problems


def check_spec(ctx: VerifyContext) -> list[Problem]:
    """``spec.yaml`` loads with the manifest's hash, and every run it defines is in the manifest."""
    if ctx.manifest is None:
        return []
    if not (ctx.base / SPEC_COPY).is_file():
        return [Problem("missing_file", SPEC_COPY, "spec.yaml (the campaign's spec) is missing")]
    try:
        # Never with the folder on sys.path: none of its files is importable code.
        spec = load_spec(ctx.base / SPEC_COPY, recipe_folder=False)
    except InputError as exc:
        return [Problem("spec_changed", SPEC_COPY, f"spec.yaml no longer loads: {exc}")]
    problems = []
    if ctx.manifest.get("spec_sha256") != spec_sha256(spec):
        detail = "the spec's sha256 differs from the manifest's spec_sha256"
        problems.append(Problem("spec_changed", SPEC_COPY, detail))
    problems += tracking_problems(spec, manifest=ctx.manifest)
    for name in spec.run_names() if spec.control is not None else []:
        if not spec.run_config(name).builtin:
            # A user's recipe file is not looked up (a dotted module's package would run);
            # its run is found by name, its code by the sealed hashes of its model folder.
            if not any(info.get("run") == name for info in ctx.runs.values()):
                detail = f"run '{name}' of the spec is not in the manifest"
                problems.append(Problem("missing_run", MANIFEST, detail))
            continue
        rid = spec.resolve_run(name).run_id
        if rid not in ctx.runs:
            detail = f"run '{name}' ({rid}) of the spec is not in the manifest"
            problems.append(Problem("missing_run", run_relpath(rid), detail))
    return problems


def tracking_problems(spec: CampaignSpec, *, manifest: Mapping[str, Any]) -> list[Problem]:
    """The spec's tracking section is the one the manifest sealed (it is not in spec_sha256,
    the campaign's identity, so it is sealed on its own; a manifest without it sealed none)."""
    sealed = manifest.get("tracking", TrackingSpec().model_dump(mode="json"))
    if sealed == spec.tracking.model_dump(mode="json"):
        return []
    detail = "the spec's tracking section (its tracking server) differs from the manifest's"
    return [Problem("spec_changed", SPEC_COPY, detail)]


def check_manifest_runs(ctx: VerifyContext) -> list[Problem]:
    """The manifest's runs are objects keyed by a folder name inside ``runs/``."""
    runs = (ctx.manifest or {}).get("runs") or {}
    if not isinstance(runs, Mapping):
        return [Problem("invalid_manifest", MANIFEST, "'runs' is not an object")]
    problems = []
    for rid, info in runs.items():
        if not isinstance(info, Mapping):
            problems.append(Problem("invalid_manifest", MANIFEST, f"run {rid!r} is not an object"))
        elif not run_id_is_a_name(rid):
            detail = f"run ID {rid!r} is not a folder name inside runs/"
            problems.append(Problem("escaping_path", MANIFEST, detail))
    return problems


def _lacking_files(ctx: VerifyContext, run_id: str) -> list[str]:
    """The files a completed run should have and does not (relative to its folder)."""
    rdir = run_path(ctx.base, run_id)
    lacking = [f for f in RUN_FILES if not (rdir / f).is_file()]
    lacking += [f"{MODEL_DIR}/{f}" for f in MODEL_FILES if not (rdir / MODEL_DIR / f).is_file()]
    return lacking


def check_expected_runs(ctx: VerifyContext) -> list[Problem]:
    """Each stopped run's stop is in ``stops.jsonl``; each completed run has all its files."""
    if ctx.manifest is None:
        return []
    # The lines that parse: a bad line is named by check_json.
    stops = ctx.json_docs(STOPS)[0] if (ctx.base / STOPS).is_file() else []
    stop_ids = {r.get("stop_id") for r in stops if isinstance(r, Mapping)}
    problems = []
    for rid, info in ctx.runs.items():
        rdir = run_relpath(rid)
        if info.get("stop_id") and info["stop_id"] not in stop_ids:
            detail = f"stop {info['stop_id']} of run {rid} is not in stops.jsonl"
            problems.append(Problem("unknown_stop", rdir, detail))
        if info.get("status") != "completed":
            continue
        if not (ctx.base / rdir).is_dir():
            detail = (
                f"expected run {rid} ({info.get('run')}) is completed but its folder is missing"
            )
            problems.append(Problem("missing_run", rdir, detail))
            continue
        for f in _lacking_files(ctx, rid):
            detail = f"completed run {rid} lacks {f}"
            problems.append(Problem("missing_file", f"{rdir}/{f}", detail))
    return problems


def check_corpus(ctx: VerifyContext) -> list[Problem]:
    """The corpus the predictions came from is there (copied or external) with its sha256."""
    corpus = (ctx.manifest or {}).get("corpus")
    if not isinstance(corpus, Mapping):
        return []
    if corpus.get("kind") == "copied":
        rel, named = str(corpus.get("path", "")), str(corpus.get("path"))
        if _escapes(rel):
            return []  # already named by check_escaping_paths
        if not rel or not (ctx.base / rel).exists():
            return [Problem("corpus_missing", named, "the corpus copy is missing")]
        return _corpus_pin(ctx.base / rel, corpus, named=named, what="the corpus copy")
    # A temporary location is named by check_temp_paths, from the manifest's text.
    loc = str(corpus.get("location", ""))
    if not loc or not Path(loc).exists():
        return [Problem("corpus_missing", MANIFEST, f"the external corpus '{loc}' is missing")]
    return _corpus_pin(Path(loc), corpus, named=MANIFEST, what=f"the external corpus '{loc}'")


def _corpus_pin(path: Path, corpus: Mapping[str, Any], *, named: str, what: str) -> list[Problem]:
    """The corpus at ``path`` against the manifest's sha256 (a pin that cannot be taken, such
    as a folder holding a link, is a problem of the folder, not an error of the command)."""
    try:
        actual = input_sha256(path)
    except (InputError, OSError) as exc:
        return [Problem("corpus_mismatch", named, f"{what} cannot be pinned: {exc}")]
    if actual != corpus.get("sha256"):
        return [Problem("corpus_mismatch", named, f"{what} does not have the recorded sha256")]
    return []


#: The run states whose model must reload: completed runs, runs a stop rule ended after their
#: model was written (the quality floor), and runs interrupted under ``resume: inference``
#: whose last good model and predictions were written (evidence).
RELOADED_STATES = ("completed", "stopped", "interrupted")


def check_models_reload(ctx: VerifyContext) -> list[Problem]:
    """Every completed run's model (and a stopped or interrupted run's kept model) reloads in
    a fresh process and reproduces its predictions.

    Runs without a folder, a ``predictions.csv`` or model files are skipped (named by
    ``check_expected_runs`` for a completed run; a stopped or interrupted run need not have
    them). The runs reproduced exactly go to ``ctx.reloaded``. A user's recipe is imported
    from the folder's copy only when the manifest is anchored or the user trusts the folder;
    else as installed or from ``ctx.recipe_dirs`` with the recorded sha256, and a run with
    neither goes to ``ctx.not_reloaded`` with why (not a problem: nothing was shown wrong).
    """
    if ctx.manifest is None or not ctx.reload:
        return []
    to_reload = [
        rid
        for rid, info in ctx.runs.items()
        if info.get("status") in RELOADED_STATES
        and run_path(ctx.base, rid).is_dir()
        and not any(
            f == PREDICTIONS_FILE or f.startswith(f"{MODEL_DIR}/") for f in _lacking_files(ctx, rid)
        )
    ]
    problems = []
    found = reload_in_fresh_process(
        ctx.base,
        to_reload,
        timeout_s=ctx.timeout_s,
        trust_folder_code=ctx.trust_folder_code or ctx.anchored,
        recipe_dirs=ctx.recipe_dirs,
    )
    for rid, res in found.items():
        if res.get("ok"):
            ctx.reloaded.append(rid)
        elif res.get("skipped") and _in_dirs(res.get("found"), ctx.recipe_dirs):
            # The user's own recipe (--recipes) is not the code that made the model: a finding.
            detail = f"your recipe file is not the one the model recorded: {res['skipped']}"
            problems.append(Problem("recipe_mismatch", run_relpath(rid, MODEL_DIR), detail))
        elif res.get("skipped"):
            ctx.not_reloaded.append(f"model of run {rid} not reloaded: {res['skipped']}")
        elif res.get("error"):
            detail = f"the model does not reload in a fresh process: {res['error']}"
            problems.append(Problem("reload_failed", run_relpath(rid, MODEL_DIR), detail))
        else:
            fm = res.get("first_mismatch") or {}
            detail = (
                f"the reloaded model differs on {res.get('mismatches')} of {res.get('rows')} rows "
                f"(first: id {fm.get('id')}: expected {fm.get('expected')}, got {fm.get('got')})"
            )
            problems.append(
                Problem("predictions_mismatch", run_relpath(rid, PREDICTIONS_FILE), detail)
            )
    return problems


def _in_dirs(path: str | None, dirs: Iterable[str]) -> bool:
    return path is not None and any(
        Path(path).resolve().is_relative_to(Path(d).resolve()) for d in dirs
    )


#: The checks that only read bytes: nothing of the folder runs as code.
INTEGRITY_CHECKS: tuple[Callable[[VerifyContext], list[Problem]], ...] = (
    check_manifest_readable,
    check_anchor,
    check_links,
    check_empty_files,
    check_json,
    check_temp_paths,
    check_escaping_paths,
    check_manifest_files,
    check_plan_hash,
    check_manifest_runs,
    check_expected_runs,
    check_corpus,
    check_timeline,
)
#: Those of them whose problems say the folder is not the one sealed (a file changed, added,
#: removed or linked; no manifest to check against): its code is then never run.
SEAL_CHECKS = (
    check_manifest_readable,
    check_anchor,
    check_links,
    check_manifest_files,
    check_plan_hash,
    check_manifest_runs,
    check_corpus,
)
#: The checks that read the folder beyond its bytes: the spec copy is loaded (the folder is not
#: put on sys.path) and every model is rebuilt (weights read, a user's recipe imported from
#: trusted code only) in a child process. They run only on a folder whose integrity checks
#: passed.
TRUSTING_CHECKS: tuple[Callable[[VerifyContext], list[Problem]], ...] = (
    check_spec,
    check_verdict,
    check_models_reload,
)
CHECKS = INTEGRITY_CHECKS + TRUSTING_CHECKS


def seal_problems(root: str | Path) -> list[Problem]:
    """What says a folder is not the one its manifest sealed (a file changed, added, removed
    or linked, the plan or the corpus changed), read from its bytes alone: nothing of the
    folder is opened as code or as tensors. Empty for an intact folder."""
    ctx = VerifyContext.open(Path(root), reload=False)
    return [p for check in SEAL_CHECKS for p in check(ctx)]


def _trusting_problems(ctx: VerifyContext) -> list[Problem]:
    """The ``TRUSTING_CHECKS`` on a sealed folder; an anchored one is read from a private copy
    of what its anchored manifest vouches for (``verify.private``), so a file swapped in the
    folder after the check is never what loads or runs. What they found goes into ``ctx``."""
    if ctx.expect is None or not ctx.anchored:
        return [p for check in TRUSTING_CHECKS for p in check(ctx)]
    with private_copy(ctx.base, expect=ctx.expect) as copy:
        if copy is None:  # the manifest changed since it was checked
            return check_anchor(ctx) or [
                Problem("manifest_not_anchored", MANIFEST, "manifest.json changed during verify")
            ]
        mine = VerifyContext.open(
            copy,
            reload=ctx.reload,
            timeout_s=ctx.timeout_s,
            expect=ctx.expect,
            trust_folder_code=ctx.trust_folder_code,
            recipe_dirs=ctx.recipe_dirs,
        )
        problems = [p for check in SEAL_CHECKS for p in check(mine)]
        if not problems:  # the copy is the folder sealed: only then is its code trusted
            problems = [p for check in TRUSTING_CHECKS for p in check(mine)]
        ctx.reloaded += mine.reloaded
        ctx.not_reloaded += mine.not_reloaded
        return problems


def verify_output(
    root: str | Path,
    *,
    reload: bool = True,
    timeout_s: float = 600,
    expect: str | None = None,
    trust_folder_code: bool = False,
    recipe_dirs: Iterable[str | Path] = (),
) -> VerifyReport:
    """Check an output folder and name each problem.

    The integrity checks come first and read bytes only; the spec copy is loaded and the
    models reloaded (``TRUSTING_CHECKS``) only when they found nothing, else ``skipped`` says
    why. Checks, in order (``CHECKS``): the manifest lists every file with its size and sha256
    (and nothing else); no file is empty; JSON files parse; no path points into a temporary
    folder or out of the folder; ``plan.json`` still has the hash written at the start; the
    spec copy still has the recorded hash and every run it defines appears with a status; the
    sealed verdict is the one recomputed from the folder's per-example scores and metrics
    (``verify/verdict.py``); each ``completed`` run has its files and a model; a stopped
    run's stop is in ``stops.jsonl``; the corpus is there with its hash; and (``reload=True``)
    every model reloads in a fresh process and reproduces its ``predictions.csv`` exactly on
    CPU.

    Problem codes: missing_manifest, invalid_manifest, manifest_not_anchored, missing_file,
    unlisted_file,
    size_mismatch, hash_mismatch, empty_file, invalid_json, temp_path, escaping_path, symlink,
    missing_plan, plan_changed, spec_changed, missing_run, unknown_stop, corpus_missing,
    corpus_mismatch, verdict_mismatch, reload_failed, predictions_mismatch, recipe_mismatch
    (a ``recipe_dirs`` file with another sha256 than the model recorded).

    Args:
        root: the output folder.
        reload: also reload every completed run's model in a fresh process.
        timeout_s: limit for the reload process.
        expect: the manifest's sha256 kept outside the folder (printed at the close); another
            sha256 is the problem ``manifest_not_anchored``, and the same one anchors the
            folder: its copies of recipe code may then be imported.
        trust_folder_code: import the folder's copies of recipe code without an anchor.
        recipe_dirs: folders of trusted recipe files (a spec's folder) for the reload.
    """
    base = Path(root)
    if not base.is_dir():
        problem = Problem("missing_manifest", ".", f"'{base}' is not a folder")
        return VerifyReport(verified=False, problems=[problem])
    ctx = VerifyContext.open(
        base,
        reload=reload,
        timeout_s=timeout_s,
        expect=None if expect is None else expect.strip().lower(),
        trust_folder_code=trust_folder_code,
        recipe_dirs=tuple(str(d) for d in recipe_dirs),
    )
    found = {check: check(ctx) for check in INTEGRITY_CHECKS}
    problems = [p for ps in found.values() for p in ps]
    unsealed = sum(len(found[check]) for check in SEAL_CHECKS)
    skipped = []
    if unsealed or ctx.manifest is None:
        # Integrity before trust: a folder that is not the one sealed may hold anyone's code;
        # none of it is imported and no model is reloaded.
        skipped.append(
            f"the spec copy and the models were not loaded: {unsealed} problem(s) say the "
            "folder is not the one its manifest.json sealed; no recipe copy was imported and "
            "no model reloaded"
        )
    else:
        problems += _trusting_problems(ctx)
        skipped += ctx.not_reloaded
    return VerifyReport(
        verified=not problems and ctx.manifest is not None,
        problems=problems,
        checked_files=len(ctx.present),
        reloaded_runs=ctx.reloaded,
        skipped=skipped,
        manifest_sha256=ctx.manifest_sha256(),
        anchored=None if expect is None else ctx.anchored,
        folder_code_trusted=trust_folder_code or ctx.anchored,
    )
