"""The walk of the output folder and of the campaign spec from the train task down.

Runs the train task's function once, for real, on a small campaign (the demo spec
``examples/digits/campaign.yaml``, its control trained on the CPU: seconds; ``--epochs``
shortens it, though a control stopped below the quality floor takes the stop's path),
against a temporary Prefect test server: the GPU lock and the artifacts are the real ones, and
prints, for the output folder and for the spec, the module visits and the returns.

Definitions (the issue's "visits" and "returns"):

- Only the calling thread is followed (``sys.setprofile``), from the task function down; the
  background threads (checkpoint saves, the lease renewal) are not.
- A *call* is a Python function call whose code lies in the project's own code
  (``src/gpucampaign`` and the Prefect layer, ``src/gpucampaign_prefect``); a generator or coroutine
  that resumes is not a new call. Its *module* is its source file.
- A call *path* is the chain of the project's functions on the stack down to the call. Each
  path counts once, at its first call: a training loop repeats the same calls at every step,
  and those repeats say nothing about the structure (``calls`` says how many there were).
- A call *carries the output folder* when one of its arguments (``self``, positional, keyword,
  ``*args`` and ``**kwargs`` items) is the output folder: a path (``str`` or ``os.PathLike``)
  equal to OUT or under it (as an absolute, normalized path), or an object whose ``root``,
  ``path`` or ``out`` attribute is such a path (the ``OutputFolder``, a ``RunFolder``). A call
  *carries the spec* when one of its arguments ``is`` the ``CampaignSpec`` object handed to
  the task.
- In the sequence of the call paths that carry X, in first-call order: a *visit* is a call
  into a module other than the previous call's (the first call is a visit); a *return* is a
  visit to a module visited before (so left since). *Files*: the distinct modules visited.
- *From the task module*: the visits whose previous module is the entry's own module, by the
  package visited (how often the task itself goes to ``folder/`` and the like).

Usage: python bench/walk.py [--entry gpucampaign_prefect.tasks.train:train] [--run control]
       [--epochs N]
       [--spec examples/digits/campaign.yaml] [--show] [--json]

``--entry MODULE:NAME`` names the task (a Prefect task is called through its ``.fn``); it is
called as ``entry(spec, base_dir=..., out=..., run=...)`` (and ``run_id=...`` when it takes
one). The numbers are deterministic for a given code base (one thread, a seeded run), but for
the paths a clock gates: the task's live view is updated at most every 2 s, so its calls are
walked when the training lasts longer than that (the demo's control does, on this machine).
"""

from __future__ import annotations

import argparse
import dis
import importlib
import inspect
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OWN = tuple(str(ROOT / part) + os.sep for part in ("src/gpucampaign", "src/gpucampaign_prefect"))
_RESUME = dis.opmap.get("RESUME")
_ARG_FLAGS = {0x04: 1, 0x08: 1}  # CO_VARARGS, CO_VARKEYWORDS: one more name each


def _fresh(frame: Any) -> bool:
    """False for a generator or coroutine that resumes (RESUME with a non-zero argument)."""
    code, i = frame.f_code.co_code, frame.f_lasti
    if _RESUME is None or i < 0 or i + 1 >= len(code) or code[i] != _RESUME:
        return True
    return code[i + 1] == 0


def _arguments(frame: Any) -> list[Any]:
    """The values of the frame's arguments (``*args`` and ``**kwargs`` items included)."""
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    n += sum(extra for flag, extra in _ARG_FLAGS.items() if code.co_flags & flag)
    local = frame.f_locals
    values: list[Any] = []
    for name in code.co_varnames[:n]:
        value = local.get(name)
        if isinstance(value, tuple):
            values.extend(value)
        elif isinstance(value, dict):
            values.extend(value.values())
        values.append(value)
    return values


class Walk:
    """The calls into the project's code that carry the output folder, and those that carry
    the spec, recorded as (module, function) in call order, each call path once."""

    def __init__(self, out: Path, spec: Any, *, holders: tuple[str, ...]) -> None:
        self.out = os.path.abspath(out)
        self.holders = holders
        self.spec = spec
        self.folder: list[tuple[str, str]] = []
        self.spec_calls: list[tuple[str, str]] = []
        self.repeats = Counter[str]()
        self._seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def _is_folder(self, value: Any) -> bool:
        if isinstance(value, str | os.PathLike):
            try:
                text = os.fspath(value)
            except TypeError:
                return False
            if not isinstance(text, str) or not text or "\x00" in text or len(text) > 4096:
                return False
            path = os.path.abspath(text)  # normalized, no file system access: no side effect
            return path == self.out or path.startswith(self.out + os.sep)
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            # The folder's value objects: OutputFolder (root), RunFolder (path, out).
            return any(self._is_folder(attributes[k]) for k in self.holders if k in attributes)
        return False

    def _first(self, kind: str, frame: Any) -> bool:
        """True the first time this call path (the project's frames down to this one) carries
        ``kind``: a loop's step repeats its calls, which count once."""
        path = []
        f = frame
        while f is not None:
            if f.f_code.co_filename.startswith(OWN):
                path.append((f.f_code.co_filename, f.f_code.co_qualname))
            f = f.f_back
        key = (kind, tuple(path))
        self.repeats[kind] += 1
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(OWN) or not _fresh(frame):
            return
        where = (os.path.relpath(filename, ROOT), frame.f_code.co_qualname)
        args = _arguments(frame)
        if any(a is self.spec for a in args) and self._first("spec", frame):
            self.spec_calls.append(where)
        if any(self._is_folder(a) for a in args) and self._first("folder", frame):
            self.folder.append(where)


def summarize(calls: list[tuple[str, str]], entry_module: str, repeats: int) -> dict[str, Any]:
    """Visits, returns, the files and the task module's own trips, of one sequence of calls."""
    visits: list[str] = []
    for module, _ in calls:
        if not visits or visits[-1] != module:
            visits.append(module)
    seen: set[str] = set()
    returns = 0
    from_entry: Counter[str] = Counter()
    for i, module in enumerate(visits):
        if module in seen:
            returns += 1
        seen.add(module)
        if i and visits[i - 1] == entry_module:
            from_entry[_package(module)] += 1
    return {
        "paths": len(calls),
        "calls": repeats,
        "visits": len(visits),
        "returns": returns,
        "files": len(seen),
        "visits_per_file": dict(Counter(visits).most_common()),
        "from_the_task_module": dict(from_entry.most_common()),
        "sequence": visits,
    }


def _package(module: str) -> str:
    parts = Path(module).parts
    if parts[:2] == ("src", "gpucampaign") and len(parts) > 3:
        return parts[2] + "/"
    return module


def _entry(text: str) -> Any:
    name, _, attr = text.partition(":")
    obj = importlib.import_module(name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "fn", obj)


def _small_spec(src: Path, work: Path, epochs: int | None) -> Path:
    """The spec and its corpus copied into ``work`` (the control trained for ``epochs``)."""
    import yaml

    data = yaml.safe_load(src.read_text(encoding="utf-8"))
    if epochs is not None:
        data["control"]["epochs"] = epochs
    corpus = data["corpus"]["path"]
    (work / corpus).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src.parent / corpus, work / corpus)
    path = work / "campaign.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _gpu_limit(name: str) -> None:
    """The GPU lock's global concurrency limit on the test server (one slot)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))


def walk(args: argparse.Namespace, work: Path) -> tuple[Walk, str]:
    """Run the entry once under the profile hook; the walk and the entry's module."""
    from prefect.testing.utilities import prefect_test_harness

    from gpucampaign.config import load_spec

    spec = load_spec(_small_spec(Path(args.spec).resolve(), work, args.epochs))
    out = work / "out"
    entry = _entry(args.entry)
    # The train task took the run's ID too before it named itself by a callable.
    takes_id = "run_id" in inspect.signature(inspect.unwrap(entry)).parameters
    ids = {"run_id": spec.resolve_run(args.run).run_id} if takes_id else {}
    recorder = Walk(out, spec, holders=tuple(h for h in args.holders.split(",") if h))
    with prefect_test_harness(server_startup_timeout=None):
        _gpu_limit(spec.gpu_lock.name)
        sys.setprofile(recorder.profile)
        try:
            entry(spec, base_dir=str(work), out=str(out), run=args.run, **ids)
        finally:
            sys.setprofile(None)
    task_module = inspect.unwrap(entry).__code__.co_filename
    return recorder, os.path.relpath(task_module, ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--entry", default="gpucampaign_prefect.tasks.train:train", help="MODULE:NAME of the task"
    )
    parser.add_argument("--spec", default=str(ROOT / "examples" / "digits" / "campaign.yaml"))
    parser.add_argument("--run", default="control")
    parser.add_argument("--epochs", type=int, default=None, help="the control's (the spec's)")
    parser.add_argument("--show", action="store_true", help="print each sequence of visits")
    parser.add_argument(
        "--holders",
        default="root,path,out",
        help="the attributes through which an object holds the folder (comma-separated); "
        "'root' alone is the first count's definition (an OutputFolder, not a RunFolder)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="walk-prefect-home-")
    os.environ["PREFECT_HOME"] = home
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    work = Path(tempfile.mkdtemp(prefix="walk-"))
    try:
        recorder, entry_module = walk(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    figures = {
        "entry": args.entry,
        "output_folder": summarize(recorder.folder, entry_module, recorder.repeats["folder"]),
        "spec": summarize(recorder.spec_calls, entry_module, recorder.repeats["spec"]),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    epochs = "the spec's epochs" if args.epochs is None else f"{args.epochs} epoch(s)"
    print(f"entry {args.entry} ({entry_module}), run {args.run}, {epochs}")
    for key, label in (("output_folder", "the output folder"), ("spec", "the campaign spec")):
        f = figures[key]
        print(
            f"{label}: {f['visits']} visits over {f['files']} files, {f['returns']} returns "
            f"({f['paths']} call paths, {f['calls']} calls)"
        )
        print(f"  from the task module: {f['from_the_task_module']}")
        for module, n in f["visits_per_file"].items():
            print(f"  {n:3d}  {module}")
        if args.show:
            print("  sequence: " + " > ".join(f["sequence"]))


if __name__ == "__main__":
    main()
