"""The campaign spec: one frozen pydantic object that every phase receives.

A spec is a YAML file. Only ``name``, ``packages``, ``window_hours`` (optional) and
``calendar`` are needed to plan; the training parts (corpus, control, variants, decision
rule...) may be absent until the campaign is run.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_serializer, model_validator

from gpucampaign.config.links import check_links
from gpucampaign.config.lots import Package, Step
from gpucampaign.config.parts import (
    DEFAULT_ROUNDS,
    MAX_CALENDAR_STEPS,
    MAX_EXPENSES,
    MAX_HOURS,
    MAX_INPUTS,
    MAX_PACKAGES,
    MAX_PEOPLE,
    MAX_RUNS,
    MAX_VARIANTS,
    NAME_PATTERN,
    TIERS,
    CheckpointSpec,
    CorpusSpec,
    DecisionPointSpec,
    DecisionRule,
    DeliverySpec,
    Expense,
    GpuLockSpec,
    InputSpec,
    PilotSpec,
    RunConfig,
    StopRules,
    StorageSpec,
    TrackingSpec,
    Variant,
    _Frozen,
    canonical_json,
    check_relative_path,
)
from gpucampaign.config.recipefile import recipe_hashes, use_recipe_dir
from gpucampaign.config.resolved import ResolvedRun
from gpucampaign.core.errors import SpecError
from gpucampaign.core.gcpause import without_gc_pauses

#: Each spec object's resolved runs, by ``id`` (dropped with the spec): ``CampaignSpec._memo``.
_MEMOS: dict[int, dict[tuple[str, str], Any]] = {}
_MEMO_LOCK = threading.RLock()  # a run's config is resolved inside its resolution


class CampaignSpec(_Frozen):
    """A training campaign that must end in a decision."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Campaign name, used in IDs and folder names."
    )
    question: str = Field(default="", description="The decision the campaign must reach.")
    packages: tuple[Package, ...] = Field(
        min_length=1, max_length=MAX_PACKAGES, description="Committed lots."
    )
    window_hours: float | None = Field(
        default=None,
        gt=0,
        le=MAX_HOURS,
        description="Rental window; defaults to the shortest committed lot's duration.",
    )
    people: int = Field(default=1, ge=1, le=MAX_PEOPLE, description="Number of human lanes.")
    calendar: tuple[Step, ...] = Field(
        min_length=1,
        max_length=MAX_CALENDAR_STEPS,
        description="End-to-end steps, human and machine.",
    )
    catalog: str | None = Field(
        default=None, description="Extra catalog YAML, relative to the spec file."
    )
    corpus: CorpusSpec | None = Field(default=None, description="The fixed corpus.")
    inputs: dict[str, InputSpec] = Field(
        default_factory=dict,
        max_length=MAX_INPUTS,
        description="More pinned inputs by name (e.g. a base model), given to recipes as "
        "ctx.inputs[name].",
    )
    control: RunConfig | None = Field(default=None, description="The control run's configuration.")
    variants: tuple[Variant, ...] = Field(
        default=(), max_length=MAX_VARIANTS, description="Variants, each changing few factors."
    )
    decision_rule: DecisionRule | None = Field(
        default=None, description="Metric, direction, threshold."
    )
    stop_rules: StopRules = Field(default_factory=StopRules, description="Stop rules.")
    pilot: PilotSpec = Field(default_factory=PilotSpec, description="Pilot settings.")
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
        description="Save policy: interval, checkpoints kept, interruptions.",
    )
    storage: StorageSpec = Field(default_factory=StorageSpec, description="Checkpoint storage.")
    decision_point: DecisionPointSpec = Field(
        default_factory=DecisionPointSpec, description="Decision point."
    )
    deliveries: DeliverySpec = Field(default_factory=DeliverySpec, description="Delivery unit.")
    expenses: tuple[Expense, ...] = Field(
        default=(), max_length=MAX_EXPENSES, description="Other expenses really incurred."
    )
    gpu_lock: GpuLockSpec = Field(default_factory=GpuLockSpec, description="GPU lock settings.")
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Experiment tracking (MLflow), off by default."
    )

    @model_serializer(mode="wrap")
    def _control_seeds(self, handler: Any) -> dict[str, Any]:
        # The control's ``seeds`` are left out of a RunConfig's own dump (they are not part of a
        # run's numbers, its ID or its params.json), but they are part of the campaign: every
        # dump of the spec (the spec's sha256, the copy in the output folder, the spec a restart
        # check's child or a data-parallel worker reads) carries them, or the runs
        # 'control.s<k>' vanish on the way.
        data: dict[str, Any] = handler(self)
        control = data.get("control")
        if self.control is not None and self.control.seeds and isinstance(control, dict):
            data["control"] = {**control, "seeds": list(self.control.seeds)}
        return data

    @field_validator("catalog")
    @classmethod
    def _catalog_inside(cls, v: str | None) -> str | None:
        return None if v is None else check_relative_path(v, field="catalog")

    @model_validator(mode="after")
    def _consistent(self) -> CampaignSpec:
        check_links(self.calendar)
        run_names = ["control"] + [v.name for v in self.variants]
        dup_runs = sorted({n for n in run_names if run_names.count(n) > 1})
        if dup_runs:
            raise ValueError(
                f"variants: duplicate run name(s) {dup_runs}; give every run a unique name"
            )
        runs = [("control", self.control.seeds if self.control else ())] + [
            (v.name, v.seeds) for v in self.variants
        ]
        total = sum(max(1, len(seeds)) for _, seeds in runs)
        if total > MAX_RUNS:
            raise ValueError(
                f"seeds: the control, the variants and their replicate seeds make {total} runs, "
                f"more than the {MAX_RUNS} a campaign may have; give fewer seeds or variants"
            )
        for run, seeds in runs:
            if len(set(seeds)) != len(seeds) or any(k < 0 for k in seeds):
                raise ValueError(
                    f"seeds of '{run}': {list(seeds)} repeats a seed or has a negative one; "
                    "give distinct seeds >= 0"
                )
        if self.variants and self.control is None:
            raise ValueError(
                "variants need a 'control' run configuration to change from; add 'control'"
            )
        for v in self.variants:
            assert self.control is not None
            try:
                merge_changes(self.control, v.changes)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(
                    f"variant '{v.name}': change {'.'.join(map(str, err['loc']))} is invalid: "
                    f"{err['msg']}"
                ) from None
        seed_runs = [f"{run}.s{k}" for run, seeds in runs for k in seeds[1:]]
        for s in self.calendar:
            if s.run is not None and s.run not in run_names + seed_runs:
                seeded = f", nor a seed run ({', '.join(seed_runs[:3])})" if seed_runs else ""
                raise ValueError(
                    f"calendar step '{s.name}': run '{s.run}' is neither 'control' nor a "
                    f"variant name{seeded}"
                )
        return self

    # --- derived values -------------------------------------------------------------------
    @property
    def window(self) -> float:
        """The rental window in hours (explicit, or the shortest committed lot)."""
        if self.window_hours is not None:
            return self.window_hours
        return float(min(p.days for p in self.packages) * 24)

    def base_names(self) -> list[str]:
        """Control first, then variants in spec order (no replicates)."""
        return (["control"] if self.control is not None else []) + [v.name for v in self.variants]

    def seeds_of(self, run: str) -> tuple[int, ...]:
        """The replicate seeds a base run asks for (empty: one run, its own seed)."""
        if run == "control":
            return self.control.seeds if self.control is not None else ()
        return next((v.seeds for v in self.variants if v.name == run), ())

    def with_seeds(self, seeds: Mapping[str, Sequence[int]]) -> CampaignSpec:
        """A copy of this spec whose base runs in ``seeds`` have those replicate seeds (the
        first is the run itself and must be its own seed, so that its run ID stays), validated
        again (the run count, distinct seeds)."""
        data = self.model_dump(mode="python")
        for base, given in seeds.items():
            if base == "control":
                data["control"]["seeds"] = tuple(given)
            else:
                for v in data["variants"]:
                    if v["name"] == base:
                        v["seeds"] = tuple(given)
        return type(self).model_validate(data)

    def replicate_of(self, run: str) -> tuple[str, int] | None:
        """``(base run, seed)`` of a replicate run name ``<base>.s<seed>``; None otherwise."""
        base, sep, seed = run.rpartition(".s")
        if not (sep and seed.isascii() and seed.isdigit()):
            return None
        # A set, once per base: a lookup per run stays constant-time.
        seeds = self._memo(("replicas", base), lambda: frozenset(self.seeds_of(base)[1:]))
        return (base, int(seed)) if int(seed) in seeds else None

    def run_names(self) -> list[str]:
        """Control first, then variants in spec order, each followed by its replicates."""
        return [
            name
            for base in self.base_names()
            for name in [base, *(f"{base}.s{k}" for k in self.seeds_of(base)[1:])]
        ]

    def tier_of(self, run: str) -> str:
        """Tier of a run: the control is always essential, and so are its seed replicates (no
        variant is adopted without the training noise they measure); a variant's replicate
        has its base's tier."""
        rep = self.replicate_of(run)
        if rep is not None:
            return self.tier_of(rep[0])
        if run == "control":
            return "essential"
        return next(v.tier for v in self.variants if v.name == run)

    @property
    def decision_split(self) -> str:
        """The split the decision is reported on (the test split without a decision rule)."""
        return self.decision_rule.report_split if self.decision_rule else "test"

    @property
    def selection_split(self) -> str:
        """The split the winner is chosen on (val without a decision rule)."""
        return self.decision_rule.select_split if self.decision_rule else "val"

    def essential_runs(self) -> list[str]:
        """The runs without which the campaign cannot decide (the control first)."""
        return [r for r in self.run_names() if self.tier_of(r) == "essential"]

    def runs_by_tier(self) -> list[str]:
        """Every run, essential first, then useful, then exploratory (spec order within a tier)."""
        return sorted(self.run_names(), key=lambda r: TIERS.index(self.tier_of(r)))

    # --- the runs, resolved once per spec ----------------------------------------------------
    def _memo(self, key: tuple[str, str], make: Callable[[], Any]) -> Any:
        """``make()`` once per spec object and key: the memo behind ``run_config`` and
        ``resolve_run``. It lives beside the spec, not in it, so that copying, pickling or
        walking a spec (Prefect does, from other threads) never meets a dict being filled, and
        a copy resolves its runs again (``model_copy``'s ``update`` may change them)."""
        with _MEMO_LOCK:
            memo = _MEMOS.get(id(self))
            if memo is None:
                memo = _MEMOS[id(self)] = {}
                weakref.finalize(self, _MEMOS.pop, id(self), None)
            if key not in memo:
                memo[key] = make()
            return memo[key]

    def run_config(self, run: str) -> RunConfig:
        """The resolved configuration of a run (control, or control + a variant's changes).

        Computed once per spec (the recipe file is not read): later calls return the same
        object.
        """
        config: RunConfig = self._memo(("config", run), lambda: self._merge_run_config(run))
        return config

    def _merge_run_config(self, run: str) -> RunConfig:
        if self.control is None:
            raise SpecError(
                "the spec has no 'control': add a control run configuration", field="control"
            )
        rep = self.replicate_of(run)
        if rep is not None:
            return self.run_config(rep[0]).model_copy(update={"seed": rep[1]})
        seeds = self.seeds_of(run)
        if run == "control":
            return self.control.model_copy(update={"seed": seeds[0]}) if seeds else self.control
        for v in self.variants:
            if v.name == run:
                cfg = merge_changes(self.control, v.changes)
                return cfg.model_copy(update={"seed": seeds[0]}) if seeds else cfg
        raise SpecError(f"no run named '{run}': use one of {self.run_names()}", field="run")

    def resolve_run(self, run: str) -> ResolvedRun:
        """The run's config, ID and hashes: the one resolution of a run.

        Computed once per spec (the recipe file read once); later calls return the same
        ``ResolvedRun``. Code below a phase's entry receives that object, never ``(spec, run)``
        to resolve again.

        Raises:
            SpecError: No run of that name, or no control.
            RecipeError: A recipe given by import path whose module cannot be found.
        """
        resolved: ResolvedRun = self._memo(("run", run), lambda: self._resolve_once(run))
        return resolved

    def _resolve_once(self, run: str) -> ResolvedRun:
        config = self.run_config(run)
        recipe_sha, training_sha = (None, None) if config.builtin else recipe_hashes(config.recipe)
        sha = run_payload_sha256(
            config,
            corpus_sha256=self.corpus.sha256 if self.corpus else None,
            inputs={k: v.sha256 for k, v in self.inputs.items()},
            training_sha256=training_sha,
        )
        return ResolvedRun(
            name=run,
            config=config,
            run_id=f"{run}-{sha[:10]}",
            config_sha256=sha,
            recipe_sha256=recipe_sha,
            training_sha256=training_sha,
        )

    def run_ids(self) -> dict[str, str]:
        """Every run's ID by run name, in ``run_names`` order (each run resolved once)."""
        return {r: self.resolve_run(r).run_id for r in self.run_names()}

    def needs_table(self) -> bool:
        """True when a run uses a built-in recipe, which reads the corpus as a feature table."""
        return any(self.run_config(r).builtin for r in self.run_names()) or self.control is None


def merge_changes(control: RunConfig, changes: dict[str, Any]) -> RunConfig:
    """The control with a variant's ``changes``; ``args`` merge key by key into the control's."""
    data = {**control.model_dump(), **changes}
    if "args" in changes:
        data["args"] = {**control.args, **(changes["args"] or {})}
    return RunConfig.model_validate(data)


def run_payload_sha256(
    config: RunConfig,
    *,
    corpus_sha256: str | None = None,
    inputs: dict[str, str] | None = None,
    training_sha256: str | None = None,
) -> str:
    """sha256 of what defines a run's training: the config, the pinned corpus and inputs,
    and the recipe's training source.

    The recipe's hash enters only for recipes given by import path, so editing that code
    gives a new run ID while the built-in recipes keep theirs. It is the hash of the file
    without the recipe class's ``predict`` and ``score`` (``recipefile.training_source``):
    editing only those redoes a finished run's predictions and scores, not its training.
    ``training_sha256`` is that hash when the caller has it already (else it is computed).
    """
    payload: dict[str, Any] = {"config": config.identity(), "corpus_sha256": corpus_sha256}
    if inputs:
        payload["inputs"] = dict(inputs)
    if not config.builtin:
        # Under the key the file's hash had: a recipe without predict or score keeps its IDs.
        payload["recipe_sha256"] = training_sha256 or recipe_hashes(config.recipe)[1]
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


_FIXES = {
    "extra_forbidden": "remove it or check its spelling (see `campaign schema`)",
    "missing": "add it",
    "greater_than": "give a positive number",
    "greater_than_equal": "give a larger number",
    "less_than_equal": "give a number within that limit",
    "less_than": "give a number below that limit",
    "finite_number": "give a finite number (.nan and .inf are not numbers)",
    "int_parsing_size": "give a number within the field's limit (see `campaign schema`)",
    "too_long": "give fewer entries",
    "literal_error": "use one of the allowed values",
    "string_pattern_mismatch": "use letters, digits, '_', '.' or '-' (hashes: 64 lower-case hex)",
    "too_short": "give at least one entry",
}


def format_validation_error(exc: ValidationError, *, source: str) -> SpecError:
    """Turn pydantic's report into one paragraph that names the field and the fix."""
    parts = []
    first_field = ""
    errors = exc.errors()
    locs = [tuple(e["loc"]) for e in errors]
    # A container's "too short" is only the echo of its invalid item: keep the deeper error.
    errors = [
        e
        for e, loc in zip(errors, locs, strict=True)
        if not any(o != loc and o[: len(loc)] == loc for o in locs)
    ]
    for err in errors[:3]:
        loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith("function-after"))
        loc = re.sub(r"\.(\d+)", r"[\1]", loc)
        msg = err["msg"].removeprefix("Value error, ")
        if not loc:
            # Cross-field checks start their message with the field they concern.
            first_field = first_field or msg.split(":")[0].split(" ")[0]
        first_field = first_field or loc
        fix = _FIXES.get(err["type"])
        given = err.get("input")
        shown = (
            ""
            if err["type"] in ("missing",) or isinstance(given, dict | list)
            else f" (got {_short(given)})"
        )
        head = f"field '{loc}': " if loc else ""
        parts.append(f"{head}{msg}{shown}" + (f"; fix: {fix}" if fix else ""))
    more = len(errors) - 3
    tail = f" ({more} more problem(s) after these)" if more > 0 else ""
    return SpecError(
        f"Invalid campaign spec {source}: " + "; ".join(parts) + tail + ".", field=first_field
    )


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a huge value stays out of the message)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: The largest spec (or catalog) file read: a spec is a page of YAML, never megabytes.
MAX_SPEC_BYTES = 1_000_000
#: The deepest nesting of mappings and lists a spec file may have.
MAX_SPEC_DEPTH = 64


class _SpecLoader(yaml.SafeLoader):
    """``yaml.safe_load`` without aliases and with bounded nesting.

    An alias (``*name``) repeats a node without repeating its text: a few lines of nested
    aliases expand into billions of values that validation, hashing and printing would walk.
    A spec has no need of them, so they are refused, as is nesting deeper than
    ``MAX_SPEC_DEPTH``.
    """

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"found the alias '*{event.anchor}': aliases are refused in a campaign file "
                "(a few of them can expand into billions of values); write the value out",
                event.start_mark,
            )
        self.depth += 1
        try:
            if self.depth > MAX_SPEC_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested deeper than {MAX_SPEC_DEPTH} levels",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml(text: str) -> Any:
    """YAML text as Python data, aliases refused and nesting bounded (``_SpecLoader``).

    Raises:
        yaml.YAMLError: The text does not parse, holds an alias or nests too deep.
        ValueError: A number in it is too long to convert (over 4300 digits).
    """
    loader = _SpecLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_problem(exc: Exception) -> str:
    """One line of what a parser refused and where (YAML's marks: line and column)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f"{exc.context} " if exc.context else ""
        return f"{context}{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return "a number of more than 4300 digits"
    return " ".join(str(exc).split())


def read_user_text(path: Path, *, what: str, field: str) -> str:
    """The text of a user-named file, refused above ``MAX_SPEC_BYTES`` before it is read.

    Raises:
        SpecError: The file is too large or is not UTF-8.
    """
    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            f"{what} '{path}' is {size} bytes, more than the {MAX_SPEC_BYTES} bytes a campaign "
            "file may have; keep data in the corpus and inputs, not in the spec.",
            field=field,
        )
    with path.open("rb") as f:
        raw = f.read(MAX_SPEC_BYTES + 1)
    if len(raw) > MAX_SPEC_BYTES:  # it grew while read
        raise SpecError(
            f"{what} '{path}' is more than the {MAX_SPEC_BYTES} bytes a campaign file may have.",
            field=field,
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{what} '{path}' is not UTF-8 text ({exc}); save it as UTF-8.", field=field
        ) from None


def parse_spec(data: Any, *, source: str = "<spec>") -> CampaignSpec:
    """Validate a mapping into a CampaignSpec, raising SpecError on bad input."""
    if not isinstance(data, dict):
        raise SpecError(
            f"Invalid campaign spec {source}: the top level must be a mapping of fields."
        )
    try:
        with without_gc_pauses():  # a calendar of 100k steps is 100k models
            return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, source=source) from None


def load_spec(path: str | Path, *, recipe_folder: bool = True) -> CampaignSpec:
    """Read and validate a YAML (or JSON) spec file.

    ``recipe_folder``: put the file's folder first on ``sys.path``, so the recipes it names
    are found there. False for the spec copy of an output folder, whose code is not trusted.
    """
    p = Path(path)
    if not p.is_file():
        raise SpecError(
            f"Spec file '{p}' does not exist: give the path of a campaign YAML file.", field="SPEC"
        )
    if recipe_folder:
        use_recipe_dir(p.resolve().parent)
    text = read_user_text(p, what="Spec file", field="SPEC")
    try:
        data = load_yaml(text)
    except (yaml.YAMLError, ValueError) as exc:
        raise SpecError(
            f"Spec file '{p}' is not valid YAML ({parse_problem(exc)}); fix it there.", field="SPEC"
        ) from None
    return parse_spec(data, source=f"'{p}'")


#: How a user-named file of each format is parsed, the errors that mean it does not parse, and
#: the hint said with them.
_PARSERS: dict[str, tuple[Callable[[str], Any], tuple[type[Exception], ...], str]] = {
    "JSON": (json.loads, (ValueError, RecursionError), ""),
    "YAML": (load_yaml, (yaml.YAMLError, ValueError), "; fix the syntax."),
}


def read_mapping_file(
    path: Path, *, field: str, missing: str, not_mapping: str, fmt: str = "YAML", where: str = ""
) -> dict[str, Any]:
    """The mapping a user-named JSON or YAML file holds.

    Args:
        path: the file.
        field: the field (or CLI argument) the errors name.
        missing: the error when the file does not exist.
        not_mapping: what the error says of ``path`` when it holds no mapping.
        fmt: ``JSON`` or ``YAML``.
        where: the start of every error (e.g. ``field 'catalog': ``).

    Raises:
        SpecError: the file is missing, does not parse, or holds no mapping.
    """
    if not path.is_file():
        raise SpecError(f"{where}{missing}", field=field)
    parse, errors, hint = _PARSERS[fmt]
    # A YAML file is written by a person: its size is bounded like a spec's.
    text = read_user_text(path, what=f"{where}file", field=field) if fmt == "YAML" else None
    try:
        data = parse(path.read_text(encoding="utf-8") if text is None else text)
    except errors as exc:
        raise SpecError(
            f"{where}'{path}' is not valid {fmt} ({parse_problem(exc)}){hint}", field=field
        ) from None
    if not isinstance(data, dict):
        raise SpecError(f"{where}'{path}' {not_mapping}", field=field)
    return data


def resolve_inside(base: str | Path, relative: str, *, field: str) -> Path:
    """Resolve ``relative`` under ``base``; raise SpecError when it would escape ``base``."""
    root = Path(base).resolve()
    try:
        check_relative_path(relative, field=field)
    except ValueError as exc:
        raise SpecError(f"field '{field}': {exc}.", field=field) from None
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise SpecError(
            f"field '{field}': '{relative}' resolves outside '{root}' (through a link?); "
            "keep the file inside the spec's folder.",
            field=field,
        )
    return target


def spec_sha256(spec: CampaignSpec) -> str:
    """Hash of the validated spec's canonical JSON.

    Where the runs are tracked (``tracking``) and which work queue runs a lot (a lot's
    ``work_queue``) are left out: they change nothing the campaign computes, and a campaign
    resumed with tracking switched on, or handed over to another queue, keeps its ID.
    """
    body = spec.model_dump(
        mode="json", exclude={"tracking": True, "packages": {"__all__": {"work_queue"}}}
    )
    # The bound on rounds of seeds came later: at its default it is left out, so that a spec
    # (and a folder sealed) before it keeps its hash.
    if spec.decision_point.rounds == DEFAULT_ROUNDS:
        body["decision_point"].pop("rounds", None)
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()
