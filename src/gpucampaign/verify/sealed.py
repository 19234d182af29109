"""A rerun of a campaign closed for good: the folder is verified against its own manifest and
nothing in it is rewritten (``preflight.closed_for_good`` says which folders are).

``campaign run`` and the campaign flow both answer such a rerun with this summary instead of a
new close: a new close would write a new ``manifest.json`` (its sha256 changed), and the anchor
the user kept from the first close (``campaign verify OUT --expect SHA``) would fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpucampaign.folder.layout import MANIFEST
from gpucampaign.verify.checks import verify_output


def recheck_sealed(root: str | Path, *, expect: str) -> dict[str, Any]:
    """Verify a folder closed for good (models reloaded) without writing into it.

    Args:
        root: The output folder.
        expect: The sha256 of its ``manifest.json`` as the rerun found it.

    Returns:
        The campaign's summary as its close returned it (``campaign run`` prints it), read
        from the sealed manifest, with this verification's verdict, its problems and
        ``already_closed``: the sentence that says nothing was rewritten.
    """
    base = Path(root)
    report = verify_output(base, reload=True, expect=expect)
    try:
        sealed = json.loads((base / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        sealed = {}
    budget = sealed.get("budget") or {}
    runs = sealed.get("runs") or {}
    state = "verified" if report.verified else "NOT verified"
    return {
        "campaign_id": str(sealed.get("campaign_id") or ""),
        "out": str(base),
        "verdict": sealed.get("verdict") or {},
        "spent_usd": budget.get("spent_usd"),
        "rental_per_accepted_usd": budget.get("rental_per_accepted_usd"),
        "runs": {rid: str(r.get("status")) for rid, r in runs.items() if isinstance(r, dict)},
        "decision": None,
        "verified": report.verified,
        "problems": [f"{p.code} {p.path}: {p.detail}" for p in report.problems],
        "manifest_sha256": report.manifest_sha256,
        "mirrored": {},
        "essential_stop": None,
        "already_closed": (
            f"the campaign in '{base}' was closed for good (manifest.json sha256 {expect}); "
            f"this rerun trained nothing and rewrote nothing: the folder {state} against its "
            "manifest. To train again, start a new campaign with a new --out."
        ),
    }
