"""The data audit of a campaign: the corpus table of the built-in recipes, or what a recipe reads.

``audit_corpus`` is the one entry (the audit task calls it). A table corpus is audited by
``data.corpus.audit_table_corpus``; a corpus that a recipe reads is audited here, through
the recipe's own ``datasets``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from gpucampaign.config import CampaignSpec
from gpucampaign.core.stoprules import EssentialInputMissing
from gpucampaign.data.corpus import AUDIT_RUN_ID, audit_table_corpus, load_spec_corpus
from gpucampaign.data.pins import describe_pin
from gpucampaign.recipe.contract import load_recipe
from gpucampaign.recipe.runtime import build_datasets, recipe_context, required_splits


def audit_corpus(
    spec: CampaignSpec, *, base_dir: str | Path, strict: bool = True
) -> dict[str, Any]:
    """Audit the spec's corpus and return a JSON-ready report (see ``audit_table_corpus``).

    Raises:
        EssentialInputMissing: File missing or altered, or (strict) any hard finding.
        SpecError: No corpus section, a path escaping ``base_dir``, unreadable columns.
    """
    if spec.corpus is not None and not spec.needs_table():
        return audit_recipe_corpus(spec, base_dir=base_dir, strict=strict)
    return audit_table_corpus(spec, base_dir=base_dir, strict=strict)


def audit_recipe_corpus(
    spec: CampaignSpec, *, base_dir: str | Path, strict: bool = True
) -> dict[str, Any]:
    """The audit of a corpus a recipe reads: the pin, the inputs, the splits it returns.

    Hard findings: an empty train split or decision split; the same ID in two splits, when
    the recipe's datasets expose ``ids``. The corpus and the inputs are recorded with sizes.

    Raises:
        EssentialInputMissing: The corpus or an input is missing or changed, or (``strict``)
            a hard finding.
    """
    t0 = time.perf_counter()
    corpus = load_spec_corpus(spec, base_dir=base_dir)
    config = spec.run_config("control")
    recipe = load_recipe(config.recipe)
    ctx = recipe_context(config, corpus=corpus, run_id=AUDIT_RUN_ID, device=torch.device("cpu"))
    datasets = build_datasets(recipe, config, ctx)
    sizes = {name: len(ds) for name, ds in datasets.items()}
    findings: list[dict[str, Any]] = [
        {
            "check": "empty_split",
            "severity": "hard",
            "count": 0,
            "examples": [],
            "message": f"the {name} split is empty",
        }
        for name in required_splits(spec)
        if not sizes.get(name)
    ]
    findings += _shared_ids(datasets)
    hard = [f for f in findings if f["severity"] == "hard"]
    if hard and strict:
        raise EssentialInputMissing(
            AUDIT_RUN_ID, "corpus failed its audit: " + "; ".join(f["message"] for f in hard)
        )
    pin = describe_pin(corpus)
    return {
        "ok": not hard,
        "path": spec.corpus.path if spec.corpus else None,
        "sha256": {"pinned": corpus.sha256, "actual": corpus.sha256, "match": True},
        "bytes": pin["bytes"],
        "kind": pin["kind"],
        "recipe": config.recipe,
        "rows": {"total": sum(sizes.values()), **sizes},
        "inputs": {name: describe_pin(p) for name, p in corpus.inputs.items()},
        "decision_split": spec.decision_split,
        "findings": findings,
        "n_hard": len(hard),
        "n_soft": len(findings) - len(hard),
        "audit_s": round(time.perf_counter() - t0, 6),
    }


def _shared_ids(datasets: dict[str, Any]) -> list[dict[str, Any]]:
    """Hard: an ID in two splits, for datasets that expose their examples' ``ids``."""
    seen: dict[str, str] = {}
    shared: list[str] = []
    for name, ds in datasets.items():
        for i in getattr(ds, "ids", None) or ():
            key = str(i)
            if key in seen and seen[key] != name:
                shared.append(key)
            seen.setdefault(key, name)
    if not shared:
        return []
    return [
        {
            "check": "shared_ids",
            "severity": "hard",
            "count": len(shared),
            "examples": shared[:5],
            "message": f"{len(shared)} ID(s) are in two splits",
        }
    ]
