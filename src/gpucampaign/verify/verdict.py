"""The verdict recomputed: ``campaign verify`` trusts no number of the sealed verdict.

The hashes of the manifest say that no file changed since the seal, not that the seal's verdict
follows from the files: a folder whose ``report.json`` verdict was rewritten, or whose
per-example scores were improved, and whose manifest was re-hashed, has every hash right. So
the verdict is recomputed from the folder's raw records (each run's ``result.json``,
predictions and per-example scores, ``stops.jsonl``, ``decisions.jsonl``) by the function the
close calls (``close.closing.folder_verdict``), and every field of it (kind, run, answer, text,
each variant's values, gains and intervals, the numbers) must equal the verdict kept in
``report.json`` and ``manifest.json``; ``report.md`` and ``report.html`` must be what the close
renders from ``report.json`` with the recomputed verdict (``verify.records``). Only the
bytes of the folder are read: the spec copy is loaded without its folder on ``sys.path``, the
run IDs are the manifest's (a user's recipe is never looked up), and no model is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpucampaign.close.closing import folder_verdict
from gpucampaign.close.report import render_records
from gpucampaign.close.verdict_steps import refuse_rejected
from gpucampaign.config import load_spec
from gpucampaign.core.errors import InputError
from gpucampaign.folder.layout import MANIFEST, REPORT_HTML, REPORT_JSON, REPORT_MD, SPEC_COPY
from gpucampaign.plan.tariffs import load_catalog
from gpucampaign.recipe.contract import RecipeError
from gpucampaign.verify.context import Problem, VerifyContext
from gpucampaign.verify.records import record_problems, rendered_records

#: How many differing fields a problem names (the count says how many there are).
SHOWN = 4
_WORDS = ("verdict.text", "verdict.answer")


def differences(sealed: Any, recomputed: Any, path: str = "verdict") -> Iterator[str]:
    """Each field where ``sealed`` differs from ``recomputed``, as ``path: sealed, recomputed``
    (exact: both come from the same JSON-ready numbers)."""
    if isinstance(sealed, Mapping) and isinstance(recomputed, Mapping):
        for key in list(recomputed) + [k for k in sealed if k not in recomputed]:
            yield from differences(sealed.get(key), recomputed.get(key), f"{path}.{key}")
    elif (
        isinstance(sealed, list) and isinstance(recomputed, list) and len(sealed) == len(recomputed)
    ):
        for n, (a, b) in enumerate(zip(sealed, recomputed, strict=True)):
            yield from differences(a, b, f"{path}[{n}]")
    elif sealed != recomputed or type(sealed) is not type(recomputed):
        if isinstance(sealed, int | float) and isinstance(recomputed, int | float):
            if sealed == recomputed:
                return  # 1 and 1.0: the same number
        yield f"{path}: the folder says {_short(sealed)}, recomputed {_short(recomputed)}"


def _short(x: Any) -> str:
    text = json.dumps(x, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


def _sealed_reasons(sealed: Mapping[str, Any], recomputed: dict[str, Any]) -> dict[str, Any]:
    """``recomputed`` with the sealed words for why a run has no interval, where they could not
    be checked here: they name what the run's recipe defines, and a recipe whose only code is
    the folder's copy is not imported (``does not load`` here). Words, never a number."""
    pairs = {}
    for name, splits in (recomputed.get("variants") or {}).items():
        for split, entry in (splits or {}).items():
            mine = (entry or {}).get("no_interval")
            theirs = (((sealed.get("variants") or {}).get(name) or {}).get(split) or {}).get(
                "no_interval"
            )
            if isinstance(mine, str) and isinstance(theirs, str) and "does not load" in mine:
                pairs[mine] = theirs
    if not pairs:
        return recomputed
    text = json.dumps(recomputed)
    for mine, theirs in pairs.items():
        text = text.replace(json.dumps(mine)[1:-1], json.dumps(theirs)[1:-1])
    return dict(json.loads(text))


def recompute_verdict(ctx: VerifyContext) -> tuple[dict[str, Any] | None, str]:
    """The folder's verdict recomputed from its records (JSON-ready), or None and why not
    (a spec copy that does not load or a run missing from the manifest: named by the spec's
    own check)."""
    try:
        spec = load_spec(ctx.base / SPEC_COPY, recipe_folder=False)
        catalog = load_catalog(spec=spec, base_dir=ctx.base)
    except InputError as exc:
        return None, f"the spec copy or its catalog does not load: {exc}"
    run_ids = {str(info.get("run")): rid for rid, info in ctx.runs.items()}
    missing = [run for run in spec.run_names() if run not in run_ids]
    if missing:
        return None, f"run(s) {', '.join(missing)} of the spec are not in the manifest"
    try:
        _, verdict = folder_verdict(spec, root=ctx.base, catalog=catalog, run_ids=run_ids)
    except (InputError, RecipeError, OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"the folder's records do not give a verdict: {type(exc).__name__}: {exc}"
    # Whether a model reloads needs the corpus, which verify does not read: the close's
    # rejected deliveries are taken as sealed, and only keep a rejected run from being adopted.
    verdict = refuse_rejected(verdict, rejected=_rejected(ctx))
    return json.loads(json.dumps(verdict.to_dict())), ""


def _rejected(ctx: VerifyContext) -> dict[str, str]:
    """The rejected deliveries of the sealed report, by run name."""
    docs = ctx.json_docs(REPORT_JSON)[0] if (ctx.base / REPORT_JSON).is_file() else []
    report = docs[0] if docs and isinstance(docs[0], Mapping) else {}
    rows = (report.get("budget") or {}).get("rejected") or []
    return {
        str(ctx.runs[r["id"]].get("run")): str(r.get("reason", ""))
        for r in rows
        if isinstance(r, Mapping) and r.get("id") in ctx.runs
    }


def check_verdict(ctx: VerifyContext) -> list[Problem]:
    """The sealed verdict (``report.json``, ``manifest.json``) is the one the folder's raw
    per-example scores and metrics give, and ``report.md``/``report.html`` are what it renders
    (``verdict_mismatch``)."""
    if ctx.manifest is None or not (ctx.base / SPEC_COPY).is_file():
        return []
    recomputed, why = recompute_verdict(ctx)
    if recomputed is None:
        if why.startswith("the folder's records"):
            return [Problem("verdict_mismatch", REPORT_JSON, f"not recomputed: {why}")]
        return []  # named by check_spec
    problems = []
    report = ctx.json_docs(REPORT_JSON)[0] if (ctx.base / REPORT_JSON).is_file() else []
    kept = [
        (MANIFEST, ctx.manifest.get("verdict")),
        (REPORT_JSON, report[0].get("verdict") if report and isinstance(report[0], dict) else None),
    ]
    for rel, sealed in kept:
        if sealed is None:
            detail = "it keeps no verdict; the folder's records give one"
            problems.append(Problem("verdict_mismatch", rel, detail))
            continue
        # The numbers first (a gain, a bound, a value), then the words that state them.
        mine = _sealed_reasons(sealed, recomputed) if isinstance(sealed, Mapping) else recomputed
        found = sorted(differences(sealed, mine), key=lambda d: d.split(":")[0] in _WORDS)
        if found:
            more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
            detail = (
                f"{len(found)} field(s) of its verdict differ from the verdict recomputed from "
                f"the folder's per-example scores and metrics: {'; '.join(found[:SHOWN])}{more}"
            )
            problems.append(Problem("verdict_mismatch", rel, detail))
    # What a reader sees: report.md and report.html rendered again from the recomputed verdict
    # must be the files kept (a forged headline, or the true text hidden in a comment, fails).
    sealed_v = ctx.manifest.get("verdict")
    shown = _sealed_reasons(sealed_v, recomputed) if isinstance(sealed_v, Mapping) else recomputed
    texts = {rel: ctx.text(rel) for rel in (REPORT_MD, REPORT_HTML)}
    if report:
        for rel, detail in record_problems(
            report=report[0], verdict=shown, root=ctx.base, texts=texts
        ):
            problems.append(Problem("verdict_mismatch", rel, detail))
    return problems


def readable_report(root: str | Path, report: Mapping[str, Any]) -> tuple[Any, str, str]:
    """What ``campaign report`` shows: the verdict (recomputed from the folder's records, or
    ``report``'s own when it cannot be), ``report.md`` generated now from ``report`` (the
    folder's ``report.json``) with that verdict, and a warning (empty when the sealed verdict
    is the recomputed one). The kept ``report.md`` is never printed: a forged headline in it,
    or in ``report.json``, is never shown as the answer."""
    ctx = VerifyContext.open(Path(root), reload=False)
    recomputed, why = recompute_verdict(ctx) if ctx.manifest is not None else (None, "")
    sealed = report.get("verdict")
    if recomputed is None:
        warning = (
            "The verdict below is the one report.json keeps: it could not be recomputed from "
            f"the folder's records ({why or 'no readable manifest.json'}). Run `campaign "
            "verify` on the folder before trusting it."
        )
        return sealed, render_records(report, root=root)[REPORT_MD], warning
    shown = _sealed_reasons(sealed, recomputed) if isinstance(sealed, Mapping) else recomputed
    found = list(differences(sealed, shown))
    warning = ""
    if found:
        warning = (
            f"report.json's verdict differs from the one the folder's records give in "
            f"{len(found)} field(s) ({'; '.join(found[:2])}): shown is the recomputed "
            "verdict. `campaign verify` names every difference."
        )
    return shown, rendered_records(report, verdict=shown, root=root)[REPORT_MD], warning
