"""The ``lane`` flow: one machine's share of a campaign, run on that lot's machine.

With several lots (machines), a Prefect server and an ``s3://`` store, the campaign flow starts
one flow run of the ``lane`` deployment per machine on that lot's work queue
(``flows/_machines.py``); the worker of that queue, on that machine, runs it here. The machine
trains its chains of runs in a local folder of its own (``<out>-lot-<K>``: a cache, never the
campaign's folder), each phase under the GPU limit of its machine (``gpu:<K>``), on the GPU the
plan gave it there (``Machine.gpu_index``). Checkpoints go to the store under each run's keys;
its records (run folders, timeline, stops) to its own keys (``storage.lanefiles``), which the
campaign flow takes in once every machine is done. The pilot, the decision point, the restart
check, the close and the manifest stay in the campaign flow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import State, allow_failure, flow, get_run_logger
from prefect.states import Completed, Failed

from gpucampaign.core.interrupt import Interrupted, graceful_signals
from gpucampaign.core.stoprules import StopRule
from gpucampaign.core.text import redact_logging
from gpucampaign.folder.lock import writer_lock
from gpucampaign.plan.lots import pin_lane_lot
from gpucampaign.preflight import open_campaign
from gpucampaign.preflight.ownership import mark_owned
from gpucampaign.storage import open_store
from gpucampaign.storage.lanefiles import publish_lane, seed_lane
from gpucampaign_prefect.orchestration.gpu_lock import embedded_api, ensure_gpu_limit, say_lock_note
from gpucampaign_prefect.orchestration.phases import stop_of
from gpucampaign_prefect.tasks.train import train


def lane_folder(out: str, *, lot: int) -> str:
    """The local folder a machine trains in: ``out/campaign`` -> ``out/campaign-lot-2``."""
    return f"{out.rstrip('/')}-lot-{lot}"


# No flow_run_name of its own: the campaign flow names each machine's run (``<campaign> lot K``),
# and a flow's template would rename it when it starts.
@flow(name="lane", log_prints=False)
def lane(
    spec: str, out: str, lot: int, chains: list[list[str]], base_dir: str | None = None
) -> State[Any]:
    """Train one machine's chains of runs (the campaign flow starts it; see the module).

    Args:
        spec: path of the campaign YAML, as the campaign's flow run was given it.
        out: the campaign's output folder; this machine trains in ``<out>-lot-<lot>``.
        lot: the machine: its lot's number among the spec's lots, from 1.
        chains: the runs of each of the machine's GPUs, in order (``plan.lanes.machine_chains``).
        base_dir: folder a spec object's paths are relative to (see the campaign flow).

    Returns:
        Completed with ``{"lot", "runs", "folder"}``: each run's end on this machine
        (``completed``, ``stopped: ...``); Failed when a run failed or the lane was
        interrupted. Its records are in the store under ``lanes/lot-<lot>/`` either way.
    """
    redact_logging()
    logger = get_run_logger()
    opened = open_campaign(spec, lane_folder(out, lot=lot), base_dir=base_dir)
    cs, folder = opened.spec, opened.folder
    machine = opened.plan.machines[lot - 1]
    # This flow run's process is a lot's machine (its records, its lot's end): its worker's
    # pin, else this lane's lot (a plain `prefect worker start` on lot K's queue).
    if (here := pin_lane_lot(cs, lot=lot, env=os.environ)) != lot:
        logger.info("%s's lane on the machine of lot %d (its worker's pin)", machine.name, here)
    folder.root.mkdir(parents=True, exist_ok=True)
    mark_owned(folder.root, campaign=cs.name)
    folder.keep_spec(opened.spec_copy, source=opened.source)
    limit = machine.gpu_limit(cs.gpu_lock.name)
    note = ensure_gpu_limit(limit, slots=len(machine.lanes), clear_stale=embedded_api())
    say_lock_note(note, logger=logger)
    common = {"base_dir": str(opened.base_dir), "out": str(folder.root)}
    store = open_store(cs.storage.url, out=folder.root)
    run_ids = [cs.resolve_run(r).run_id for chain in chains for r in chain]
    seed_lane(folder.root, store=store, run_ids=run_ids)  # the pilots' folders, the stops
    ends: dict[str, str] = {}
    with graceful_signals(), writer_lock(folder.root, what=f"lane of {machine.name}"):
        try:
            futures = _submit_chains(cs, chains=chains, lot=lot, common=common)
            for run, fut in futures.items():
                ends[run] = _end_of(fut)
                publish_lane(folder.root, store=store, lot=lot, run_ids=run_ids)
        except Interrupted as exc:
            logger.warning("%s: %s; its runs resume from the store", machine.name, exc)
            ends["interrupted"] = str(exc)
        finally:  # what it did, even when it ends early: the campaign's flow reads it
            publish_lane(folder.root, store=store, lot=lot, run_ids=run_ids)
    said = ", ".join(f"{r}: {e}" for r, e in ends.items())
    logger.info("%s trained %s", machine.name, said)
    summary = {"lot": lot, "runs": ends, "folder": str(Path(folder.root))}
    if any(e.startswith("failed") or r == "interrupted" for r, e in ends.items()):
        # The campaign's flow sees a machine that did not finish its lane, and says so.
        return Failed(message=f"{machine.name}: {said}", data=summary)
    return Completed(data=summary)


def _submit_chains(
    cs: Any, *, chains: list[list[str]], lot: int, common: dict[str, str]
) -> dict[str, Any]:
    """Submit each GPU's chain: a run starts when the one before it on that GPU ended."""
    futures: dict[str, Any] = {}
    for index, chain in enumerate(chains):
        tail = None
        for run in chain:
            wait: list[Any] | None = [allow_failure(tail)] if tail is not None else None
            futures[run] = tail = train.submit(
                cs, run=run, lane=index, lot=lot, return_state=False, wait_for=wait, **common
            )
    return futures


def _end_of(future: Any) -> str:
    """How a run's training ended on this machine, in a word and its reason."""
    try:
        stop = stop_of(future.result())
    except Interrupted:
        raise
    except StopRule as exc:
        return f"stopped: {exc}"
    except Exception as exc:  # its stop is recorded in stops.jsonl; the close reads it there
        return f"failed: {type(exc).__name__}: {exc}"
    return "completed" if stop is None else f"stopped: {stop}"
