"""The fresh process of a restart check, and how the checks start and wait for it.

A check runs ``sys.executable -m gpucampaign.restartcheck.child child ...`` with the run's
own thread count (``threads`` in its config; results differ across thread counts). The child
trains or resumes one run with ``train_run`` and writes its ``RunResult`` (or the stop that
ended it) as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpucampaign.config import CampaignSpec, parse_spec
from gpucampaign.config.recipefile import RECIPE_DIRS
from gpucampaign.core.stoprules import NoUsableRestart, StopRule
from gpucampaign.data.corpus import open_corpus
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.storage import LocalStore


def _child_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m gpucampaign.restartcheck.child child")
    p.add_argument("--spec", required=True, type=Path)
    p.add_argument("--run", required=True)
    p.add_argument("--corpus", required=True, type=Path)
    p.add_argument("--input", action="append", default=[], help="NAME=PATH of a pinned input")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--store", required=True, type=Path)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--result", required=True, type=Path)
    a = p.parse_args(argv)
    spec = parse_spec(json.loads(a.spec.read_text(encoding="utf-8")), source=str(a.spec))
    assert spec.corpus is not None
    try:
        run = spec.resolve_run(a.run)
        inputs = {k: Path(v) for k, _, v in (item.partition("=") for item in a.input)}
        corpus = open_corpus(
            a.corpus, spec=spec, base_dir=None, run_id=run.run_id, input_paths=inputs
        )
        res = train_run(
            spec,
            run=run,
            corpus=corpus,
            store=LocalStore(a.store),
            run_folder=RunFolder.scratch(a.out, run.run_id),
            stop_after_steps=a.stop_after,
            checkpoint_every=a.checkpoint_every,
        )
    except StopRule as exc:
        a.result.write_text(json.dumps({"stop": exc.to_record()}), encoding="utf-8")
        return 3
    a.result.write_text(json.dumps({"result": res.to_dict()}), encoding="utf-8")
    return 0


def spawn(args: list[str], *, threads: int, workdir: Path, name: str) -> subprocess.Popen:
    """Start a child with ``args`` (see ``child_args``); its output goes to ``<name>.log``."""
    env = dict(os.environ)
    env.update(
        {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"}
    )
    # The check trains copies of a run, not the campaign's run: nothing of it goes to MLflow.
    env["GPUCAMPAIGN_TRACKING"] = "off"
    # The spec's recipe folders, so a child imports the same recipe file.
    env["PYTHONPATH"] = os.pathsep.join([*RECIPE_DIRS, *filter(None, [env.get("PYTHONPATH")])])
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed in wait
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucampaign.restartcheck.child", "child", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    proc.log_file = log  # type: ignore[attr-defined]
    proc.log_path = workdir / f"{name}.log"  # type: ignore[attr-defined]
    proc.result_path = Path(args[args.index("--result") + 1])  # type: ignore[attr-defined]
    return proc


def wait(proc: subprocess.Popen, *, run_id: str, what: str) -> dict[str, Any]:
    """The child's ``RunResult`` as a dict, once it exits.

    Raises:
        NoUsableRestart: The child failed or stopped (its stop or its log's tail says why).
    """
    rc = proc.wait()
    proc.log_file.close()  # type: ignore[attr-defined]
    path: Path = proc.result_path  # type: ignore[attr-defined]
    out = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if rc != 0 or "result" not in out:
        log_path: Path = proc.log_path  # type: ignore[attr-defined]
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-1500:]
        why = (
            f"stop {out['stop']['rule']}: {out['stop']['reason']}"
            if "stop" in out
            else f"exit {rc}: {tail}"
        )
        raise NoUsableRestart(run_id, f"the {what} process failed ({why})")
    return out["result"]


def write_child_spec(spec: CampaignSpec, workdir: Path) -> Path:
    """The spec the children read. The quality floor is off there: a check that reaches the
    last step must not fail on the run's quality, which is not what it verifies (the run ID
    does not depend on stop rules, so the children resume the same run)."""
    rules = spec.stop_rules.model_copy(update={"below_threshold": False})
    child = spec.model_copy(update={"stop_rules": rules})
    path = workdir / "spec.json"
    path.write_text(json.dumps(child.model_dump(mode="json")), encoding="utf-8")
    return path


def child_args(
    *,
    spec_json: Path,
    run: str,
    corpus: Path,
    out: Path,
    store: Path,
    result: Path,
    stop_after: int,
    checkpoint_every: int,
    inputs: Mapping[str, Path] | None = None,
) -> list[str]:
    """The command line of a child that trains ``run`` up to step ``stop_after``; ``inputs``
    are where the spec's pinned inputs are (``pins.resolve_inputs``)."""
    pinned = [a for name, p in (inputs or {}).items() for a in ("--input", f"{name}={p}")]
    return pinned + [
        "--spec",
        str(spec_json),
        "--run",
        run,
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--store",
        str(store),
        "--stop-after",
        str(stop_after),
        "--checkpoint-every",
        str(checkpoint_every),
        "--result",
        str(result),
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m gpucampaign.restartcheck.child child ...`` (started by the restart checks)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "child":
        sys.stderr.write(
            "usage: python -m gpucampaign.restartcheck.child child --spec ... (internal)\n"
        )
        return 2
    return _child_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
