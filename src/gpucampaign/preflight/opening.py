"""One entry: a campaign's spec loaded, checked and preflighted, its output folder checked,
once, into one value that every caller passes on.

``campaign run`` opens the campaign before Prefect starts and hands the ``OpenCampaign`` to the
campaign flow; the flow opens only raw input (a deployment's ``spec`` and ``out``), so a spec is
parsed and preflighted once whichever way the campaign starts. Nothing here writes until
``start_folder``, which the flow calls under the folder's writer lock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpucampaign.config import CampaignSpec, load_spec, resolve_inside, spec_sha256
from gpucampaign.config.recipefile import recipe_file
from gpucampaign.core.errors import ArgumentError, FolderError, InputError
from gpucampaign.core.storageurl import is_s3
from gpucampaign.data.pins import input_sha256
from gpucampaign.folder.layout import MANIFEST, SPEC_COPY, OutputFolder
from gpucampaign.folder.records import spec_with_rounds
from gpucampaign.plan import calendar
from gpucampaign.plan.calendar import Plan
from gpucampaign.plan.tariffs import Catalog, load_catalog
from gpucampaign.preflight.checks import Preflight, preflight
from gpucampaign.preflight.extension import extension_of, keep_extension
from gpucampaign.preflight.ownership import closed_for_good, mark_owned, refuse_foreign_folder
from gpucampaign.recipe.runtime import recipe_module_path
from gpucampaign.storage import open_store
from gpucampaign.storage.open import read_wait_s
from gpucampaign.storage.sharedtimeline import adopt_timeline


@dataclass(frozen=True)
class OpenCampaign:
    """A campaign checked before anything is written: what its callers pass on, never the raw
    spec again.

    Attributes:
        spec: The validated spec.
        base_dir: The folder the spec's paths are relative to (its recipes import from it).
        folder: The output folder (not yet created: ``start_folder`` does that).
        spec_copy: The bytes the folder keeps as ``spec.yaml``.
        source: Where the spec came from, as the refusals name it.
        checked: What the preflight checked.
        catalog: The lots' prices the plan was made with.
        plan: The plan as written at the start (``plan.json``).
        sealed: The sha256 of ``manifest.json`` when the folder holds this campaign closed for
            good (``closed_for_good``): a rerun verifies it and rewrites nothing.
        extends: What the spec adds to the one the folder holds, when it extends that
            campaign in place (``preflight.extension``): ``start_folder`` keeps both.
    """

    spec: CampaignSpec
    base_dir: Path
    folder: OutputFolder
    spec_copy: bytes
    source: str
    checked: Preflight
    catalog: Catalog
    plan: Plan
    sealed: str | None = None
    extends: str | None = None

    @property
    def name(self) -> str:
        """The campaign's name (the flow run's name and tag read it)."""
        return self.spec.name


def open_campaign(
    spec: str | Path | CampaignSpec,
    out: str | Path | None = None,
    *,
    base_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> OpenCampaign:
    """Load, check and preflight a campaign's spec and check its output folder, once.

    Args:
        spec: The spec file (parsed here), or a spec object (checked, not parsed again).
        out: The output folder; default ``out/<the spec's name>``.
        base_dir: The folder the spec's paths are relative to: the spec file's own folder by
            default, the working directory for a spec object.
        env: The environment the store's variables come from (default: ``os.environ``).

    Returns:
        The opened campaign; nothing is written yet.

    Raises:
        SpecError: The spec, its inputs, its recipes or its store fail a check, the output
            folder is a file, holds another campaign or files this tool did not write, is the
            spec's folder or above it, or is sealed with other inputs (one paragraph; exit 2
            in the CLI).
    """
    if isinstance(spec, CampaignSpec):
        cs, base = spec, Path(base_dir or ".").resolve()
        copy = yaml.safe_dump(cs.model_dump(mode="json"), sort_keys=False).encode()
        source = "the spec object given"
    else:
        cs = load_spec(spec)
        base = Path(base_dir).resolve() if base_dir else Path(spec).resolve().parent
        copy, source = Path(spec).read_bytes(), f"'{spec}'"
    target = Path(out) if out is not None else Path("out") / cs.name
    if target.exists() and not target.is_dir():
        raise ArgumentError(
            f"option '--out': '{target}' is a file, not a folder; give a new or "
            "existing output folder.",
            field="--out",
        )
    refuse_foreign_folder(
        target, spec_home=base if isinstance(spec, CampaignSpec) else Path(spec).resolve().parent
    )
    folder = OutputFolder(target)
    extends = _extends(folder, cs, copy=copy)
    if extends is None:
        folder.keep_spec(copy, source=source, check_only=True)
    refuse_sealed_rewrite(folder.root, cs, base_dir=base)
    # A run's start waits out a store that does not answer, as its reads do (plan: no wait).
    checked = preflight(cs, base_dir=base, out=target, env=env, store_wait_s=read_wait_s(cs))
    catalog = load_catalog(spec=cs, base_dir=base)
    plan = calendar.plan(cs, catalog=catalog)
    return OpenCampaign(
        spec=cs,
        base_dir=base,
        folder=folder,
        spec_copy=copy,
        source=source,
        checked=checked,
        catalog=catalog,
        plan=plan,
        sealed=closed_for_good(folder.root) if _same_recipes(cs, folder) and not extends else None,
        extends=extends,
    )


def _extends(folder: OutputFolder, cs: CampaignSpec, *, copy: bytes) -> str | None:
    """What ``cs`` adds to the campaign the folder holds when it only extends it (more seeds,
    more variants), else None (the same spec, a new folder, or another campaign)."""
    kept = folder.path(SPEC_COPY)
    if not kept.is_file() or kept.read_bytes() == copy:
        return None
    try:
        # Never with the folder on sys.path: none of its files is importable code.
        old = load_spec(kept, recipe_folder=False)
    except InputError:
        return None
    # What the campaign has: its spec's runs and the rounds of seeds it bought.
    return extension_of(spec_with_rounds(old, folder.root), cs)


def _same_recipes(cs: CampaignSpec, folder: OutputFolder) -> bool:
    """Whether each user recipe file is byte for byte the copy the folder kept beside its
    ``spec.yaml``. A recipe edited only in ``predict`` or ``score`` keeps its run IDs, and its
    rerun makes predictions and scores again with the edited file, and closes again (a new
    manifest): the folder is sealed for good only against the very inputs that sealed it."""
    for run in cs.run_names():
        config = cs.run_config(run)
        if config.builtin:
            continue
        try:
            source = recipe_file(config.recipe).read_bytes()
            kept = folder.path(recipe_module_path(config.recipe)).read_bytes()
        except (OSError, InputError):
            return False
        if source != kept:
            return False
    return True


def start_folder(opened: OpenCampaign) -> bool:
    """Create the output folder and keep the spec's copy (under the folder's writer lock).

    On an S3 store, a fresh folder starts its timeline from the copy in the store, the same
    campaign going on on another host.

    Returns:
        True when the timeline was taken from the store (the caller says so).

    Raises:
        SpecError: The folder holds another campaign's spec (written since it was opened).
    """
    folder, cs = opened.folder, opened.spec
    folder.root.mkdir(parents=True, exist_ok=True)
    mark_owned(folder.root, campaign=cs.name)  # the first file: the folder is this tool's
    if opened.extends is not None and folder.path(SPEC_COPY).read_bytes() != opened.spec_copy:
        keep_extension(folder, text=opened.spec_copy, why=opened.extends)
    folder.keep_spec(opened.spec_copy, source=opened.source)
    return is_s3(cs.storage.url) and adopt_timeline(
        folder.root,
        store=open_store(cs.storage.url, out=folder.root),
        spec_sha256=spec_sha256(cs),  # and the campaign ID: the same campaign goes on here
    )


def refuse_sealed_rewrite(root: str | Path, spec: CampaignSpec, *, base_dir: str | Path) -> None:
    """Refuse, before anything is written, a rerun into a sealed folder whose inputs changed.

    A folder with ``manifest.json`` is sealed: a rerun with the same spec and the same inputs
    may go over it again (it repeats nothing finished), but one whose corpus, pinned input or
    catalog no longer has the hash the campaign was sealed with would rewrite its records.

    Raises:
        SpecError: The folder is sealed and an input changed; the message says how to start
            a new campaign.
    """
    folder = OutputFolder(root)
    if not folder.path(MANIFEST).is_file():
        return
    try:
        sealed = json.loads(folder.path(MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        sealed = {}
    kept = (sealed.get("inputs") if isinstance(sealed, dict) else None) or {}
    pins: list[tuple[str, str, str | None]] = []
    if spec.corpus is not None:
        pins.append((f"corpus '{spec.corpus.path}'", spec.corpus.path, spec.corpus.sha256))
    pins += [(f"input '{n}' ('{i.path}')", i.path, i.sha256) for n, i in spec.inputs.items()]
    if spec.catalog is not None and isinstance(kept.get("catalog"), dict):
        pins.append((f"catalog '{spec.catalog}'", spec.catalog, kept["catalog"].get("sha256")))
    changed = []
    for label, rel, want in pins:
        try:
            path = resolve_inside(base_dir, rel, field="out")
            now = input_sha256(path) if path.exists() else None
        except (InputError, OSError) as exc:
            changed.append(f"{label} can no longer be read ({exc})")
            continue
        if now is None:
            changed.append(f"{label} is missing")
        elif want is not None and now != want:
            changed.append(f"{label} has sha256 {now}, the campaign was sealed with {want}")
    if changed:
        raise FolderError(
            f"Output folder '{folder.root}' holds a sealed campaign (manifest.json) and its "
            f"inputs changed since: {'; '.join(changed)}. A sealed folder is never rewritten; "
            "nothing was changed there. To train on the new inputs, start a new campaign: pin "
            "them again (`campaign pin PATH` prints the sha256 for the spec) and run with a "
            "new --out.",
            field="out",
        )
