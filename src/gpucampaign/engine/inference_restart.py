"""``resume: inference``: after an interruption, restart inference from the last good model.

A run config chooses what its next start does after an interruption (``RunConfig.resume``):
``training`` resumes learning from the full saved state; ``inference`` ends the run's learning
there. The rules of ``inference``:

- An interruption is the end of a training call without it finishing: a stop request (SIGINT,
  SIGTERM: the loop saves its step first; a bare Ctrl-C) or the death of the process (SIGKILL,
  out of memory, a lost machine: nothing is saved then). An error raised in the loop is a
  failure, not an interruption (it is retried, or stops the run, as before). A call in
  progress keeps a mark in its run folder (``in_progress.json``: the step it started from and
  its target step), removed when the call ends in any other way; a mark found at the next
  start is an interruption.
- The next start trains no further: the weights of the latest verified checkpoint (step K,
  loaded through safetensors and ``weights_only``) are evaluated on the val and test splits,
  written as the run's ``model/``, and ``result.json`` records the run as interrupted
  (``completed`` false, ``steps_done`` K, ``interrupted``: the step last recorded, the reason,
  K and the steps lost) with an ``interrupted`` stop (``stoprules.InterruptedRun``), which is
  raised. The campaign keeps that stop in ``stops.jsonl``; the run's state is ``interrupted``;
  its predictions are written with the other runs' and reload in ``campaign verify``; the
  verdict reads its metric as evidence at step K and says so (a variant that already clears
  the rule there can be chosen; one that does not makes the result inconclusive rather than a
  complete negative; an interrupted control compares nothing); it is never an accepted
  delivery; its machine time stays on the timeline and in the budget; in the flow, an
  interrupted essential run is an essential stop (the campaign closes, then ends Failed).
  Later starts raise the same stop again (same stop ID): the run is finished.
- Nothing to restart from, nothing lost: with no usable checkpoint the run starts from step 0
  as a fresh run; when the last good checkpoint is at the interrupted call's target (the step
  was saved just before the process ended) the run goes on as if it had not been cut.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from gpucampaign.core.files import atomic_write_bytes, json_bytes, utc_now
from gpucampaign.core.interrupt import Interrupted
from gpucampaign.core.stoprules import InterruptedRun
from gpucampaign.engine.hooks import StopRequest
from gpucampaign.engine.setup import LiveRun
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.metrics import read_metrics

KILLED = "killed"


@dataclass(frozen=True)
class Interruption:
    """How the previous training call of a run ended without finishing.

    Attributes:
        reason: ``SIGINT``, ``SIGTERM`` (a stop request) or ``killed`` (the process died).
        reached_step: The last step ``metrics.jsonl`` recorded before the end.
        checkpoint_step: The step of the latest verified checkpoint (the model kept).
        target_step: The step the interrupted call was to reach.
        planned_steps: The run's planned steps.
    """

    reason: str
    reached_step: int
    checkpoint_step: int
    target_step: int
    planned_steps: int

    @property
    def lost_steps(self) -> int:
        """Steps trained after the last checkpoint: lost."""
        return max(0, self.reached_step - self.checkpoint_step)

    def describe(self) -> str:
        """One sentence: where it stopped, why, and what the run keeps."""
        why = (
            "the process ended without stopping (SIGKILL, out of memory or a lost machine)"
            if self.reason == KILLED
            else self.reason
        )
        lost = f", {self.lost_steps} step(s) after it lost" if self.lost_steps else ""
        return (
            f"interrupted at step {self.reached_step} of {self.planned_steps} ({why}); "
            f"resume: inference: learning ends there, inference restarted from the last good "
            f"model (checkpoint of step {self.checkpoint_step}{lost}); evidence at that step, "
            "never an accepted delivery"
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``interrupted`` entry of ``result.json``."""
        return {**asdict(self), "lost_steps": self.lost_steps, "restart": "inference"}


class TrainingMark:
    """The mark of a training call in progress, in its run folder.

    ``close`` (in the call's ``finally``) removes it unless the call is ending by a stop
    request (``Interrupted``, or a bare ``KeyboardInterrupt`` where no signal handler is
    installed); a process that dies cannot remove it.
    """

    def __init__(self, run_folder: RunFolder) -> None:
        self.path = run_folder.in_progress

    @classmethod
    def open(cls, run_folder: RunFolder, *, from_step: int, target: int) -> TrainingMark:
        """Write the mark of a call that starts training at ``from_step`` towards ``target``."""
        mark = cls(run_folder)
        record = {
            "run_id": run_folder.run_id,
            "from_step": from_step,
            "target": target,
            "since": utc_now(),
        }
        atomic_write_bytes(mark.path, json_bytes(record))
        return mark

    def close(self) -> None:
        """Remove the mark, unless an interruption is on its way out of the call (called in
        its ``finally``, where ``sys.exc_info`` is the exception leaving it)."""
        if isinstance(sys.exc_info()[1], (Interrupted, KeyboardInterrupt)):
            return
        self.path.unlink(missing_ok=True)


def read_mark(run_folder: RunFolder) -> dict[str, Any] | None:
    """The mark a training call left in ``run_folder``, None when there is none (or it is
    torn)."""
    path = run_folder.in_progress
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def find_interruption(
    run_folder: RunFolder, *, resume: str, checkpoint_step: int | None, planned_steps: int
) -> Interruption | None:
    """The interruption that ``resume: inference`` turns into an inference restart, if any.

    Args:
        run_folder: The run's folder.
        resume: The run config's ``resume``; only ``inference`` finds one.
        checkpoint_step: The step of the checkpoint restored at this start (None: none).
        planned_steps: The run's planned steps.

    Returns:
        None when the config resumes training, no mark was left, no checkpoint can be
        restarted from, or the last good checkpoint already holds the interrupted call's
        target (nothing was lost).
    """
    mark = read_mark(run_folder)
    if resume != "inference" or mark is None or checkpoint_step is None:
        return None
    target = int(mark.get("target") or planned_steps)
    if checkpoint_step >= min(target, planned_steps):
        return None
    rows = read_metrics(run_folder.metrics)
    reached = max((int(r["step"]) for r in rows if r.get("kind") == "train"), default=0)
    stops = [r for r in rows if r.get("kind") == "interrupt" and r.get("reason")]
    return Interruption(
        reason=str(stops[-1]["reason"]) if stops else KILLED,
        reached_step=max(reached, checkpoint_step),
        checkpoint_step=checkpoint_step,
        target_step=target,
        planned_steps=planned_steps,
    )


def restart_inference(r: LiveRun, cut: Interruption) -> StopRequest:
    """What ends a ``resume: inference`` start after a cut: the restored model evaluated, kept
    as the run's model, the run recorded as interrupted (the loop's ``_end`` does it).

    ``r`` holds the model restored from the checkpoint of step ``cut.checkpoint_step`` and an
    open ``metrics.jsonl``; nothing is trained. The cut's ``inference_restart`` row is written
    here, before the evaluations.

    Args:
        r: The run as ``training`` set it up and restored it.
        cut: The interruption found by ``find_interruption``.
    """
    r.mlog.write({"kind": "inference_restart", "step": r.state.global_step, **cut.to_dict()})
    stop = InterruptedRun(r.run_id, cut.describe(), step=cut.checkpoint_step)
    return StopRequest.of(stop, save=False, keep_model=True, interrupted=cut.to_dict())
