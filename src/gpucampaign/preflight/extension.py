"""A campaign extended in place: the spec run again into its own output folder with more seeds
(or more variants) and nothing else changed. The folder goes on: every finished run is reused,
only the new runs train, and the folder keeps each earlier spec and plan under ``specs/`` with
a line of ``spec-history.jsonl`` saying what changed and why. Any other change of the spec is
another campaign, refused as before (``OutputFolder.keep_spec``).
"""

from __future__ import annotations

from typing import Any

from gpucampaign.config import CampaignSpec
from gpucampaign.core.files import append_jsonl, read_jsonl, sha256_bytes, utc_now
from gpucampaign.folder.layout import (
    MANIFEST,
    PLAN,
    PLAN_SHA,
    SPEC_COPY,
    SPEC_HISTORY,
    SPECS_DIR,
    OutputFolder,
)


def _seeds(spec: CampaignSpec, base: str) -> list[int]:
    return list(spec.seeds_of(base)) or [spec.run_config(base).seed]


def _core(spec: CampaignSpec) -> dict[str, Any]:
    """The spec without what an extension may change: the seeds, the variants after the kept
    ones and the calendar."""
    data = spec.model_dump(mode="json")
    data.pop("calendar", None)
    if isinstance(data.get("control"), dict):
        data["control"].pop("seeds", None)
    data["variants"] = [{k: v for k, v in x.items() if k != "seeds"} for x in data["variants"]]
    return data


def extension_of(kept: CampaignSpec, new: CampaignSpec) -> str | None:
    """What ``new`` adds to ``kept`` when it only extends it (one line: the seeds and the
    variants added), else None (another campaign).

    An extension keeps every field of the spec but the calendar (whose earlier steps it keeps
    too), keeps each variant in its place and adds variants after them, and gives each kept run
    its seeds in the same order with more after them (the first, the run itself, unchanged):
    every earlier run keeps its run ID.
    """
    if kept.control is None or new.control is None:
        return None
    a, b = _core(kept), _core(new)
    n = len(a["variants"])
    if b["variants"][:n] != a["variants"] or {**b, "variants": a["variants"]} != a:
        return None
    steps = {s.model_dump_json() for s in new.calendar}
    if any(s.model_dump_json() not in steps for s in kept.calendar):
        return None
    said = []
    for base in kept.base_names():
        old, now = _seeds(kept, base), _seeds(new, base)
        if now[: len(old)] != old:
            return None
        if len(now) > len(old):
            said.append(f"seeds {', '.join(map(str, now[len(old) :]))} of '{base}'")
    said += [f"variant '{v.name}'" for v in new.variants[n:]]
    if not said:
        return None
    if any(new.resolve_run(r).run_id != rid for r, rid in kept.run_ids().items()):
        return None
    return "extended in place: added " + "; ".join(said)


def keep_extension(folder: OutputFolder, *, text: bytes, why: str) -> int:
    """Keep the folder's spec and plan as ``specs/spec-<n>.yaml`` and ``specs/plan-<n>.json``,
    say why in ``spec-history.jsonl``, then write the new spec as ``spec.yaml``; the old plan
    and the manifest go (the flow writes the new spec's plan, the close a new manifest).

    Returns:
        ``n``, the version kept.
    """
    history = folder.path(SPEC_HISTORY)
    n = len(read_jsonl(history)) + 1
    old = folder.path(SPEC_COPY).read_bytes()
    folder.write_bytes(f"{SPECS_DIR}/spec-{n}.yaml", old)
    if folder.path(PLAN).is_file():
        folder.write_bytes(f"{SPECS_DIR}/plan-{n}.json", folder.path(PLAN).read_bytes())
    append_jsonl(
        history,
        {
            "version": n,
            "kept": f"{SPECS_DIR}/spec-{n}.yaml",
            "sha256": sha256_bytes(old),
            "now_sha256": sha256_bytes(text),
            "why": why,
            "time": utc_now(timespec="seconds"),
        },
    )
    folder.write_bytes(SPEC_COPY, text)
    for name in (PLAN, PLAN_SHA, MANIFEST):
        folder.path(name).unlink(missing_ok=True)
    return n


def extensions(folder: OutputFolder) -> list[dict[str, Any]]:
    """Every line of ``spec-history.jsonl``: the spec versions the folder went through."""
    return read_jsonl(folder.path(SPEC_HISTORY))
