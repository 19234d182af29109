"""A run is resolved once per spec: ``CampaignSpec.resolve_run`` is the one resolution, later
calls return the same object, and nothing else in the code computes a run's config, ID or
hashes (an AST scan of ``src/``: the library and the Prefect layer)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpucampaign.config import CampaignSpec, load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MODEL = ROOT / "src" / "gpucampaign" / "config" / "model.py"
#: What resolves a run; only ``config/model.py`` calls them (``resolve_run``, ``run_config``).
RESOLVING = {"_resolve_once", "_merge_run_config", "run_payload_sha256", "ResolvedRun"}
#: The re-resolving shortcuts that are gone: a caller asks ``resolve_run(name)`` for the value.
REMOVED = {"run_id", "run_sha256"}


def _calls(path: Path) -> list[tuple[str, int]]:
    """``(called name, line)`` of every call in a file (``f(...)`` and ``x.f(...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            found.append((name, node.lineno))
    return found


def _code_files() -> list[Path]:
    return [
        p
        for top in ("src",)
        for p in sorted((ROOT / top).rglob("*.py"))
        if "__pycache__" not in p.parts
    ]


def test_nothing_below_the_spec_resolves_a_run_again() -> None:
    """0 calls that compute a run's resolution outside ``CampaignSpec``, 0 calls of the
    removed ``run_id()`` / ``run_sha256()`` shortcuts anywhere (tests included)."""
    outside = [
        f"{p.relative_to(ROOT)}:{line} {name}("
        for p in _code_files()
        if p != MODEL
        for name, line in _calls(p)
        if name in RESOLVING
    ]
    removed = [
        f"{p.relative_to(ROOT)}:{line} .{name}("
        for top in ("src", "tests")
        for p in sorted((ROOT / top).rglob("*.py"))
        for name, line in _calls(p)
        if name in REMOVED and p != Path(__file__)
    ]
    assert outside == [] and removed == []
    assert not any(hasattr(CampaignSpec, name) for name in REMOVED)


def test_a_spec_resolves_each_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(EXAMPLES / "digits" / "campaign.yaml")
    resolved: list[str] = []
    real = CampaignSpec._resolve_once

    def counted(self: CampaignSpec, run: str) -> object:
        resolved.append(run)
        return real(self, run)

    monkeypatch.setattr(CampaignSpec, "_resolve_once", counted)
    ids = spec.run_ids()
    for name in spec.run_names():
        assert spec.resolve_run(name) is spec.resolve_run(name)
        assert spec.resolve_run(name).run_id == ids[name]
        assert spec.run_config(name) is spec.resolve_run(name).config
    assert resolved == spec.run_names()
    # A copy (``model_copy`` may change the runs) resolves its own, once again.
    copy = spec.model_copy()
    assert copy.resolve_run("control") == spec.resolve_run("control")
    assert resolved == [*spec.run_names(), "control"]


def test_the_memo_is_beside_the_spec_so_copies_and_walks_never_race() -> None:
    """Prefect walks, hashes and pickles a task's parameters in other threads while a task
    resolves runs: the spec itself never changes (its ``__dict__`` holds only its fields),
    a pickled or copied spec carries no memo and resolves to the same IDs."""
    import copy
    import pickle
    import threading

    spec = load_spec(EXAMPLES / "textlm" / "campaign.yaml")
    fields = dict(spec.__dict__)
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def resolve() -> None:
        start.wait()
        try:
            for _ in range(50):
                spec.run_ids()
        except BaseException as exc:  # noqa: BLE001 - a race shows up as any error
            errors.append(exc)

    def walk() -> None:
        start.wait()
        try:
            for _ in range(50):
                pickle.loads(pickle.dumps(spec))
                copy.deepcopy(spec)
                list(spec.__dict__.items())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (resolve, resolve, walk)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert spec.__dict__ == fields and set(spec.__dict__) == set(type(spec).model_fields)
    clone = pickle.loads(pickle.dumps(spec))
    assert clone == spec and clone.run_ids() == spec.run_ids()
    assert spec.model_copy().resolve_run("control") is not spec.resolve_run("control")
