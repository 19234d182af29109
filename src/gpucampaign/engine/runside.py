"""A training call's side of the campaign's output folder: one value, built once.

A training task (the Prefect layer's ``pilot`` and ``train``) hands the library this value and
nothing else of the folder: ``RunSide.open`` resolves the folder's files once (the run's
folder, ``stops.jsonl``, ``timeline.jsonl``), refuses a run already stopped, loads the pinned
inputs and opens the checkpoint store; ``segment`` records the call's machine segment and
yields its writer (``SegmentWriter.saved``: a heartbeat at each durable checkpoint, and the
timeline's copy in a remote store); ``notes`` reads what the call left to say. No path is
joined again after ``open``, and no caller climbs from the run's folder back up to the
campaign's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucampaign.checkpoint.manager import durable_step
from gpucampaign.config import CampaignSpec, ResolvedRun
from gpucampaign.core.stoprules import STOP_RULES
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.engine.lotend import LotEnded, refuse_start
from gpucampaign.engine.parts import n_train_of
from gpucampaign.folder.layout import STOPS, TIMELINE, OutputFolder, RunFolder
from gpucampaign.folder.records import read_stops_file
from gpucampaign.folder.segments import SegmentWriter, Timeline, phase_segment
from gpucampaign.storage import Store, open_store, spooled_keys
from gpucampaign.storage.lanefiles import lane_prefix
from gpucampaign.storage.open import read_wait_s
from gpucampaign.storage.sharedtimeline import share_timeline
from gpucampaign.tracking import tracking_note


@dataclass(frozen=True)
class TrainingNotes:
    """What a training call leaves to say once it returns.

    Attributes:
        n_train: Examples in the run's train split (``params.json``'s, else counted).
        unsent: The metric values MLflow did not take, in one line; None when none.
        spooled: Checkpoint files still waiting in the folder's spool for the S3 store.
        segment_s: The call's segment on the timeline, in seconds, once it ended (the pilot
            measures what the segment holds beyond ``train_run``).
    """

    n_train: int
    unsent: str | None
    spooled: list[str]
    segment_s: float | None = None


@dataclass(frozen=True)
class RunSide:
    """One training call of one run, on the output folder's side (``open`` builds it).

    Attributes:
        spec: The campaign spec.
        run: The run, resolved once.
        out: The campaign's output folder.
        run_folder: The run's folder in it (``OUT/runs/<run_id>/``).
        timeline: The folder's ``timeline.jsonl``, resolved once.
        corpus: The pinned inputs, loaded (and checked again) at the call's start.
        store: The checkpoint store.
        remote: The store is not the folder's own (S3): each durable checkpoint copies the
            timeline to it (``storage.sharedtimeline``), and checkpoint files the server did
            not take wait in the folder's spool. A local store holds both already.
        timeline_key: The timeline's key in a remote store: ``timeline.jsonl``, or a
            machine's own when it runs one lot's lanes (``storage.lanefiles``).
    """

    spec: CampaignSpec
    run: ResolvedRun
    out: OutputFolder
    run_folder: RunFolder
    timeline: Timeline
    corpus: Any
    store: Store
    remote: bool
    timeline_key: str = TIMELINE

    @classmethod
    def open(
        cls,
        spec: CampaignSpec,
        *,
        base_dir: str | Path,
        out: str | Path,
        run: ResolvedRun,
        phase: str,
        lot: int | None = None,
    ) -> RunSide:
        """The call's side of the folder ``out``: its files resolved once, its inputs loaded
        and its store open (``lot``: the machine training it when each lot's lanes run on
        their own machine, whose timeline copy goes to its own key: ``storage.lanefiles``).

        Raises:
            StopRule: The stop already recorded for this run ID: a stopped run is finished,
                never redone.
            LotEnded: The machine's lot has ended or is inside its least margin
                (``lotend.refuse_start``): nothing is started.
            EssentialInputMissing: A pinned input changed since the audit (checked again at
                each start, before the store is opened).
        """
        folder = OutputFolder(out)
        stops, timeline = folder.path(STOPS), folder.path(TIMELINE)
        run_folder = folder.run(run.run_id)
        for rec in read_stops_file(stops):
            if rec.run_id == run.run_id and rec.rule in STOP_RULES:
                raise STOP_RULES[rec.rule](
                    run.run_id, rec.reason, step=rec.step, stop_id=rec.stop_id
                )
        refuse_start(spec, what=f"{phase} of {run.run_id}")  # the lot has ended: no GPU work
        corpus = load_spec_corpus(spec, base_dir=base_dir, run_id=run.run_id)
        store = open_store(spec.storage.url, out=folder.root, read_wait_s=read_wait_s(spec))
        return cls(
            spec=spec,
            run=run,
            out=folder,
            run_folder=run_folder,
            timeline=Timeline(folder=folder, path=timeline),
            corpus=corpus,
            store=store,
            remote=store.local_path(TIMELINE) is None,
            timeline_key=TIMELINE if lot is None else f"{lane_prefix(lot)}/{TIMELINE}",
        )

    @contextlib.contextmanager
    def segment(self, *, phase: str, step: str | None) -> Iterator[SegmentWriter]:
        """The call's machine segment in ``timeline.jsonl`` (``segments.phase_segment``: a cut
        one closed first, with the work it lost since the checkpoint ``LATEST`` names now).

        Yields:
            Its writer: ``saved`` is the call's ``on_save`` (a heartbeat at each durable
            checkpoint, and the timeline's copy in a remote store).
        """
        url, root = self.spec.storage.url, self.out.root
        with phase_segment(
            self.timeline,
            self.spec,
            phase=phase,
            step=step,
            run=self.run.name,
            note=self.run.run_id,
            durable=lambda run_id: durable_step(url, out=root, run_id=run_id),
            lot_end=LotEnded,
        ) as row:
            key = self.timeline_key
            share = (
                (lambda: share_timeline(root, store=self.store, key=key)) if self.remote else None
            )
            if share is not None:
                # The open segment reaches the store before any save: a machine lost before
                # its first heartbeat leaves its segment where the campaign finds it and
                # charges the loss (else only the heartbeats' copies would hold it).
                share()
            yield SegmentWriter(self.timeline, row, after_heartbeat=share)

    def notes(self) -> TrainingNotes:
        """What the call left to say: the run's train examples, the tracking's unsent values,
        the checkpoint files still spooled."""
        return TrainingNotes(
            n_train=n_train_of(self.run_folder, run=self.run, corpus=self.corpus),
            unsent=tracking_note(self.run_folder.path),
            spooled=spooled_keys(self.out.root) if self.remote else [],
        )
