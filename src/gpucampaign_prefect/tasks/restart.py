"""Restart verification (essential): resume the control's early save in a NEW process, compare."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from gpucampaign.config import CampaignSpec
from gpucampaign.core.interrupt import raise_if_stopped
from gpucampaign.engine.lotend import refuse_start
from gpucampaign.folder.layout import RESTART_FILE
from gpucampaign.folder.progress import relay_check_progress
from gpucampaign.folder.records import read_stops
from gpucampaign.restartcheck.earlysave import campaign_restart_check, check_stopped_run
from gpucampaign.restartcheck.scheduled import OutputCheckTarget, check_latest_checkpoint
from gpucampaign_prefect.orchestration.gpu_lock import gpu_slot
from gpucampaign_prefect.orchestration.phases import (
    PHASE_OPTIONS,
    busy,
    cancel_on_interrupt,
    ends_on_stop,
    out_folder,
)


@task(name="restart-verification", task_run_name="restart-verification[{run}]", **PHASE_OPTIONS)
@cancel_on_interrupt
@ends_on_stop("restart")
def restart_verification(
    spec: CampaignSpec, *, base_dir: str, out: str, run: str
) -> dict[str, Any]:
    """Verify that ``run``'s early save resumes exactly in a new process; reuse a passed check."""
    folder = out_folder(out)
    raise_if_stopped(what=f"restart check of {run}")
    resolved = spec.resolve_run(run)
    done = folder.read_json(RESTART_FILE)
    if done and done.get("identical") and done.get("run_id") == resolved.run_id:
        return done
    # A run a stop rule ended is checked as what it is (its last checkpoint), from its record;
    # an earlier failure of this check is no stop of the run.
    stops = [s for s in read_stops(folder.root) if s.phase != "restart"]
    stop = next((s for s in stops if s.run_id == resolved.run_id), None)
    refuse_start(spec, what=f"restart check of {resolved.run_id}")  # no GPU work after the lot
    with gpu_slot(
        spec.gpu_lock.name,
        timeout_s=spec.gpu_lock.timeout_s,
        lease_s=spec.gpu_lock.lease_s,
        campaign=spec.name,
        out=out,
        run=f"restart check of {resolved.run_id}",
        slots=resolved.size.processes,  # a data-parallel run's check trains on its GPUs
    ):
        with (
            busy(folder, spec, phase="restart", run=run, note=resolved.run_id),
            tempfile.TemporaryDirectory(prefix="gpucampaign-restart-") as work,
        ):
            if stop is not None:  # its last checkpoint: loaded here, replayed only when it can
                report = check_stopped_run(
                    spec, run=resolved, stop=stop, base_dir=base_dir, out=out, workdir=Path(work)
                )
            else:
                with _relayed(Path(work), folder.run(resolved.run_id).path):
                    report = campaign_restart_check(
                        spec, run=resolved, base_dir=base_dir, out=out, workdir=Path(work)
                    )
    if report.checked:
        get_run_logger().info("restart check of %s: %s", resolved.run_id, report.checked)
    result = {**report.to_dict(), "run": run, "run_id": resolved.run_id}
    folder.write_json(RESTART_FILE, result)
    return result


@contextlib.contextmanager
def _relayed(work: Path, run_dir: Path, *, every_s: float = 1.0) -> Iterator[None]:
    """While the check's new process trains under ``work``, relay its live progress to the
    run folder (``campaign run`` and ``campaign watch`` show it as the restart-check line)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            relay_check_progress(work, run_dir)

    thread = threading.Thread(target=loop, name="restart-check-progress", daemon=True)
    thread.start()
    state = "stopped"
    try:
        yield
        state = "done"
    finally:
        stop.set()
        thread.join(timeout=5)
        relay_check_progress(work, run_dir, state=state)


@task(name="resume-check", task_run_name="resume-check[{run}]", **PHASE_OPTIONS)
@cancel_on_interrupt
def resume_check(target: OutputCheckTarget, *, out: str, run: str, steps: int) -> dict[str, Any]:
    """Resume ``run``'s latest kept checkpoint in a fresh process and compare with its record.

    Returns what was found (``ScheduledCheck.to_dict``): ``ok``, the expected checkpoint, the
    problem and the older checkpoint that would still resume; the flow fails on it.
    Nothing is written into the output folder: its manifest may already be sealed.
    """
    spec = target.spec
    with (
        gpu_slot(
            spec.gpu_lock.name,
            timeout_s=spec.gpu_lock.timeout_s,
            lease_s=spec.gpu_lock.lease_s,
            campaign=spec.name,
            out=out,
            run=f"scheduled restart check of {run}",
            slots=spec.resolve_run(run).size.processes,
        ),
        tempfile.TemporaryDirectory(prefix="gpucampaign-resume-") as work,
    ):
        found = check_latest_checkpoint(
            target.for_run(run, out=out, workdir=Path(work)), m_steps=steps
        )
    return found.to_dict()
