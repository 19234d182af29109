"""The GPU lock on a Prefect test server: creation, strict blocking, stale slots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
from prefect.states import Running

from gpucampaign_prefect.orchestration.gpu_lock import (
    _STAMP,
    embedded_api,
    ensure_gpu_limit,
    gpu_slot,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _name(tag: str) -> str:
    return f"test-{tag}-{uuid.uuid4().hex[:8]}"


def _limit(name: str):
    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name)


def _set_active(name: str, active: int) -> None:
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(
            name, GlobalConcurrencyLimitUpdate(active_slots=active)
        )


def _run_threads(*targets) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # reported to the test thread
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a lock holder never finished"
    return errors


def test_ensure_creates_missing_limit_once():
    name = _name("create")
    note = ensure_gpu_limit(name, 2, clear_stale=False)
    assert "created" in note and name in note
    limit = _limit(name)
    assert (limit.limit, limit.active_slots) == (2, 0)
    # Existing limit of the size asked for, or larger: nothing to say, and its size is kept.
    assert ensure_gpu_limit(name, 2, clear_stale=True) == ""
    assert ensure_gpu_limit(name, 1, clear_stale=True) == ""
    assert _limit(name).limit == 2


def test_ensure_raises_a_smaller_limit_and_never_lowers_it_under_a_holder():
    """A one-GPU campaign made the limit with 1 slot; a campaign on a 2-GPU lot raises it to 2
    while the first campaign holds its slot, and a later one-GPU campaign leaves it at 2."""
    name = _name("raise")
    ensure_gpu_limit(name, 1, clear_stale=False)
    with gpu_slot(name, timeout_s=10, lease_s=60):
        note = ensure_gpu_limit(name, 2, clear_stale=False)
        assert f"raised global concurrency limit '{name}' from 1 to 2 slot(s)" in note
        assert (_limit(name).limit, _limit(name).active_slots) == (2, 1)
        assert "raised" not in ensure_gpu_limit(name, 1, clear_stale=False)
        assert _limit(name).limit == 2
    # Both slots can now be taken at once: what a gpus: 2 run asks for.
    with gpu_slot(name, timeout_s=10, lease_s=60, slots=2):
        assert _limit(name).active_slots == 2


def test_ensure_rejects_zero_slots():
    with pytest.raises(ValueError, match="at least 1 slot"):
        ensure_gpu_limit(_name("zero"), 0, clear_stale=False)


def test_strict_slot_fails_without_limit():
    with pytest.raises(ConcurrencySlotAcquisitionError):
        with gpu_slot(_name("missing"), timeout_s=5, lease_s=60):
            pass


def test_one_slot_blocks_a_second_holder():
    name = _name("one")
    ensure_gpu_limit(name, 1, clear_stale=False)
    first_in, second_done = threading.Event(), threading.Event()
    intervals: dict[str, tuple[float, float]] = {}
    outcome: dict[str, object] = {}

    def first():
        with gpu_slot(name, timeout_s=60, lease_s=60):
            start = time.monotonic()
            first_in.set()
            # Hold the slot until the second holder has given up waiting for it.
            assert second_done.wait(timeout=60)
            intervals["first"] = (start, time.monotonic())

    def second():
        assert first_in.wait(timeout=60)
        try:
            with gpu_slot(name, timeout_s=1, lease_s=60):
                outcome["second"] = "acquired while the first held the slot"
        except TimeoutError:
            outcome["second"] = "timed out"
        finally:
            second_done.set()
        # Now that the first holder is gone, the slot is free again.
        with gpu_slot(name, timeout_s=60, lease_s=60):
            intervals["second"] = (time.monotonic(), time.monotonic())

    assert _run_threads(first, second) == []
    assert outcome["second"] == "timed out"
    assert intervals["second"][0] >= intervals["first"][1]
    assert _limit(name).active_slots == 0


def test_one_slot_serialises_concurrent_holders():
    name = _name("serial")
    ensure_gpu_limit(name, 1, clear_stale=False)
    intervals: list[tuple[float, float]] = []

    def holder():
        with gpu_slot(name, timeout_s=90, lease_s=60):
            start = time.monotonic()
            time.sleep(0.5)
            intervals.append((start, time.monotonic()))

    assert _run_threads(holder, holder, holder) == []
    intervals.sort()
    assert len(intervals) == 3
    for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
        assert start >= end, f"holders overlapped: {intervals}"


def test_two_slots_let_two_holders_overlap():
    name = _name("two")
    ensure_gpu_limit(name, 2, clear_stale=False)
    both_inside = threading.Barrier(2, timeout=60)
    held: list[int] = []

    def holder():
        with gpu_slot(name, timeout_s=60, lease_s=60):
            both_inside.wait()  # breaks (error) unless both hold a slot at the same time
            held.append(_limit(name).active_slots)

    assert _run_threads(holder, holder) == []
    assert held == [2, 2]


def test_a_two_gpu_run_holds_two_slots():
    name = _name("wide")
    ensure_gpu_limit(name, 2, clear_stale=False)
    with gpu_slot(name, timeout_s=60, lease_s=60, slots=2):
        assert _limit(name).active_slots == 2
        # No GPU is left for another phase while the data-parallel run holds both.
        with pytest.raises(TimeoutError), gpu_slot(name, timeout_s=1, lease_s=60):
            pass
    assert _limit(name).active_slots == 0


def test_stale_slot_is_reported_and_cleared():
    name = _name("stale")
    ensure_gpu_limit(name, 1, clear_stale=False)
    _set_active(name, 1)  # what a holder killed in embedded mode leaves behind
    note = ensure_gpu_limit(name, 1, clear_stale=False, flow_names=("no-such-flow",))
    assert "held by no running flow run" in note
    assert _limit(name).active_slots == 1

    note = ensure_gpu_limit(name, 1, clear_stale=True, flow_names=("no-such-flow",))
    assert "cleared 1 stale slot" in note
    assert _limit(name).active_slots == 0
    with gpu_slot(name, timeout_s=30, lease_s=60) as hold:
        assert hold.name == name


def test_slot_of_a_live_flow_run_is_not_cleared():
    name = _name("live")
    flow_name = _name("holder-flow")
    ensure_gpu_limit(name, 1, clear_stale=False)
    inside, checked = threading.Event(), threading.Event()
    notes: list[str] = []

    @flow(name=flow_name)
    def holder_flow():
        notes.append(ensure_gpu_limit(name, 1, clear_stale=True, flow_names=(flow_name,)))
        with gpu_slot(name, timeout_s=30, lease_s=60):
            inside.set()
            assert checked.wait(timeout=60)

    def check():
        assert inside.wait(timeout=90)
        try:
            notes.append(ensure_gpu_limit(name, 1, clear_stale=True, flow_names=(flow_name,)))
            notes.append(str(_limit(name).active_slots))
        finally:
            checked.set()

    assert _run_threads(holder_flow, check) == []
    assert notes[0] == ""
    assert "waiting for them" in notes[1] and notes[2] == "1"
    assert _limit(name).active_slots == 0


def test_slot_of_a_dead_stamped_flow_run_is_cleared():
    """A flow run left Running by a killed process (embedded mode) does not block clearing."""
    import socket

    name = _name("dead")
    flow_name = _name("dead-flow")
    ensure_gpu_limit(name, 1, clear_stale=False)
    _set_active(name, 1)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(gone.stdout)

    @flow(name=flow_name)
    def orphan():  # never called: only gives the flow run its flow
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(orphan, state=Running())
        client.update_flow_run(
            run.id, infrastructure_pid=f"{_STAMP}:{socket.gethostname()}:{dead_pid}"
        )
    note = ensure_gpu_limit(name, 1, clear_stale=True, flow_names=(flow_name,))
    assert "cleared 1 stale slot" in note
    assert _limit(name).active_slots == 0
    with get_client(sync_client=True) as client:  # no longer Running: its process is gone
        state = client.read_flow_run(run.id).state
    assert state is not None and state.is_crashed(), state


def test_a_dead_holders_slot_comes_back_and_is_named(tmp_path):
    """A holder record of a process gone from this host: its slot is given back, once."""
    import json
    import socket

    from gpucampaign_prefect.orchestration.gpu_lock import (
        free_dead_holders,
        holders_dir,
        read_holders,
    )

    name = _name("holder")
    ensure_gpu_limit(name, 1, clear_stale=False)
    alive_log: list[str] = []
    with gpu_slot(name, timeout_s=30, lease_s=60, campaign="mine", out=str(tmp_path)):
        (holder,) = read_holders(name)
        assert (holder.campaign, holder.out, holder.pid) == ("mine", str(tmp_path), os.getpid())
        assert free_dead_holders(name, log=alive_log.append) == [] and alive_log == []
        assert _limit(name).active_slots == 1
    assert read_holders(name) == [] and _limit(name).active_slots == 0

    # What a holder SIGKILLed on a shared server leaves: its lease and its record.
    from prefect.concurrency._sync import acquire_concurrency_slots_with_lease

    granted = acquire_concurrency_slots_with_lease([name], 1, lease_duration=600, strict=True)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    record = {
        "lease_id": str(granted.lease_id),
        "limit": name,
        "host": socket.gethostname(),
        "pid": int(gone.stdout),
        "since": "2026-01-01T00:00:00+00:00",
        "campaign": "killed",
        "out": "/somewhere/out",
    }
    holders_dir(name).mkdir(parents=True, exist_ok=True)
    (holders_dir(name) / f"{granted.lease_id}.json").write_text(json.dumps(record))
    said: list[str] = []
    t0 = time.monotonic()
    with gpu_slot(name, timeout_s=60, lease_s=60, recheck_s=0.5) as hold:
        assert hold.waited_s < 15 and time.monotonic() - t0 < 15
    assert [h.campaign for h in free_dead_holders(name, log=said.append)] == []  # once only
    assert _limit(name).active_slots == 0

    # The holders table a dead holder published names it until its slot is given back, then
    # a new version says the slot is free (the lease's expiry writes none).
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey

    from gpucampaign_prefect.orchestration.gpu_lock import holders_key, publish_holders

    granted = acquire_concurrency_slots_with_lease([name], 1, lease_duration=600, strict=True)
    (holders_dir(name) / f"{granted.lease_id}.json").write_text(
        json.dumps({**record, "lease_id": str(granted.lease_id)})
    )
    publish_holders(name, held=True)

    def table() -> list[dict]:
        with get_client(sync_client=True) as client:
            (latest,) = client.read_latest_artifacts(
                artifact_filter=ArtifactCollectionFilter(
                    key=ArtifactCollectionFilterKey(any_=[holders_key(name)])
                )
            )
        return json.loads(latest.data)

    assert [row.get("pid") for row in table()] == [int(gone.stdout)]
    assert [h.campaign for h in free_dead_holders(name)] == ["killed"]
    assert [row.get("pid") for row in table()] == [None]  # "(free on this host)"


def test_embedded_api_tells_own_server_from_shared_one():
    assert embedded_api() is False  # the harness server is reached through PREFECT_API_URL
    code = (
        "from gpucampaign_prefect.orchestration.gpu_lock import embedded_api; print(embedded_api())"
    )
    probe = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
    )
    assert probe.stdout.strip().splitlines()[-1] == "True"


def test_the_holder_is_shown_as_a_tag_and_a_table_while_it_holds_the_slot():
    from prefect.artifacts import Artifact

    from gpucampaign_prefect.orchestration.gpu_lock import holder_tag, holders_key

    name = _name("shown")
    ensure_gpu_limit(name, 1, clear_stale=False)
    seen: dict[str, object] = {}

    def tags(flow_run_id) -> list[str]:
        with get_client(sync_client=True) as client:
            return list(client.read_flow_run(flow_run_id).tags or [])

    def table() -> list[dict]:
        artifact = Artifact.get(holders_key(name))
        assert artifact is not None
        data = artifact.data
        return json.loads(data) if isinstance(data, str) else data

    @flow
    def holds() -> str:
        from prefect.runtime import flow_run

        with gpu_slot(name, timeout_s=60, lease_s=60, campaign="shown", run="train of c-1"):
            # Shown beside the phase (its first step does not wait for it): soon, not at once.
            deadline = time.monotonic() + 30
            while holder_tag(name) not in tags(flow_run.id) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["held_tags"] = tags(flow_run.id)
            seen["held_table"] = table()
        seen["free_tags"] = tags(flow_run.id)  # the release waits for the UI's last version
        seen["free_table"] = table()
        return flow_run.id

    holds()
    assert holder_tag(name) in seen["held_tags"]
    (row,) = seen["held_table"]
    assert (row["holder"], row["campaign"], row["limit"]) == ("train of c-1", "shown", name)
    assert row["pid"] == os.getpid()
    assert holder_tag(name) not in seen["free_tags"]
    assert seen["free_table"][0]["holder"] == "(free on this host)"


def test_the_phase_does_not_wait_for_the_ui_to_show_its_holder(monkeypatch):
    """The body of the slot (the training's first step) starts while the holders' table is
    still being published; the release comes after that publication (no write of the UI's
    beside it: SQLite refuses a second writer, and Prefect retries the release 2 s later),
    then "free" is published, and the slot's exit waits for it."""
    from gpucampaign_prefect.orchestration import gpu_lock

    name = _name("beside")
    ensure_gpu_limit(name, 1, clear_stale=False)
    api_answers = threading.Event()
    order: list[str] = []
    release = gpu_lock.release_slots

    def slow_publish(lock: str, *, held: bool) -> None:
        api_answers.wait(30)
        time.sleep(0.2)  # still writing when the body ends
        order.append("held" if held else "free")

    def released(lease_id) -> None:
        order.append("release")
        release(lease_id)

    monkeypatch.setattr(gpu_lock, "publish_holders", slow_publish)
    monkeypatch.setattr(gpu_lock, "release_slots", released)
    t0 = time.monotonic()
    with gpu_slot(name, timeout_s=60, lease_s=60, run="train of c-2"):
        entered_s = time.monotonic() - t0
        assert order == []  # the table is not there yet: the phase did not wait for it
        api_answers.set()
    assert entered_s < 20 and order == ["held", "release", "free"]
    assert _limit(name).active_slots == 0
