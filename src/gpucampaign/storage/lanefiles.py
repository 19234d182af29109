"""A machine's lane in the campaign's store: what it writes there, and how the campaign's own
folder takes it in.

When each lot's lanes run on that lot's machine (a Prefect server and an ``s3://`` store), the
machine trains in a local folder of its own (a cache) and writes its checkpoints to the store
under each run's keys, as on one machine. Its records (each run's folder, its timeline rows,
its stops) go to keys of its own, ``lanes/lot-<K>/...``: two machines never write the same key,
and none of them writes a key of the campaign's folder, whose one writer stays the campaign's
flow (its close mirrors the folder). Before they start, that flow leaves what its folder holds
of their runs (the pilots' run folders) and its stops under ``lanes/start/``, where each
machine starts its folder from (``seed_lane``). Once the lanes ended, the campaign's flow
copies each lane's run folders into its folder and appends the lane's timeline rows and stops
it does not hold yet; the close reads them as if they had been trained there. Pure; no Prefect.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpucampaign.core.files import TMP_PREFIX
from gpucampaign.folder.layout import RUNS_DIR, STOPS, TIMELINE, is_live_progress
from gpucampaign.storage.base import Store

__all__ = [
    "LANES_DIR",
    "START",
    "collect_lanes",
    "lane_prefix",
    "publish_lane",
    "publish_start",
    "seed_lane",
]

#: The store's folder of the machines' own records: ``lanes/lot-<K>/``.
LANES_DIR = "lanes"

#: The campaign flow's own copy for the machines to start from (``publish_start``).
START = f"{LANES_DIR}/start"

#: The append-only records of a lane merged line by line into the campaign's folder.
_JOURNALS = (TIMELINE, STOPS)


def lane_prefix(lot: int) -> str:
    """The store's folder of machine ``lot``'s records: ``lanes/lot-2``."""
    return f"{LANES_DIR}/lot-{lot}"


def publish_lane(root: str | Path, *, store: Store, lot: int, run_ids: Iterable[str]) -> list[str]:
    """Copy a machine's records from its local folder ``root`` to its keys in ``store``:
    the folder of each run it trained (``runs/<run ID>/``), its timeline and its stops.

    Called after each of its phases, so the campaign's flow finds what a machine lost since
    finished (temporary files and the live progress line stay local).

    Returns:
        The keys written, each under ``lane_prefix(lot)``.
    """
    return _publish(Path(root), store=store, prefix=lane_prefix(lot), run_ids=run_ids)


def publish_start(root: str | Path, *, store: Store, run_ids: Iterable[str]) -> list[str]:
    """The campaign flow's side before the machines start: what its folder holds of their runs
    (each pilot's run folder) and its stops, under ``lanes/start/``, for ``seed_lane``."""
    return _publish(Path(root), store=store, prefix=START, run_ids=run_ids, journals=(STOPS,))


def seed_lane(root: str | Path, *, store: Store, run_ids: Iterable[str]) -> int:
    """Start a machine's local folder ``root`` from ``publish_start``'s copy: the run folders of
    ``run_ids`` (a run resumes from its pilot, whose metrics it continues) and the stops; a
    file the folder holds already (a machine's earlier start) is kept. Returns the files taken.
    """
    root, prefix = Path(root), START + "/"
    wanted = tuple(f"{RUNS_DIR}/{run_id}/" for run_id in run_ids)
    taken = 0
    for key in store.list(START):
        rel = key[len(prefix) :] if key.startswith(prefix) else ""
        if (rel == STOPS or rel.startswith(wanted)) and not (root / rel).exists():
            store.get_file(key, dst=root / rel)
            taken += 1
    return taken


def _publish(
    root: Path,
    *,
    store: Store,
    prefix: str,
    run_ids: Iterable[str],
    journals: tuple[str, ...] = _JOURNALS,
) -> list[str]:
    rels = [name for name in journals if (root / name).is_file()]
    for run_id in run_ids:
        folder = root / RUNS_DIR / run_id
        files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
        rels += [
            rel
            for p in files
            if not p.name.startswith(TMP_PREFIX)
            and not is_live_progress(rel := p.relative_to(root).as_posix())
        ]
    keys = []
    for rel in rels:
        store.put_file(f"{prefix}/{rel}", src=root / rel)
        keys.append(f"{prefix}/{rel}")
    return keys


def collect_lanes(root: str | Path, *, store: Store, lots: Iterable[int]) -> dict[int, int]:
    """Take each machine's records from the store into the campaign's folder ``root``: its run
    folders copied over (each run trains on one machine), its timeline rows and stops appended
    when the folder does not hold that very line yet (a rerun collects again without doubling).

    Returns:
        The files taken from each machine, by lot.
    """
    root = Path(root)
    taken: dict[int, int] = {}
    for lot in lots:
        prefix = lane_prefix(lot) + "/"
        keys = [k for k in store.list(lane_prefix(lot)) if k.startswith(prefix)]
        for key in keys:
            rel = key[len(prefix) :]
            if rel in _JOURNALS:
                _append_new_lines(root / rel, store.read_bytes(key))
            elif rel.startswith(f"{RUNS_DIR}/"):
                store.get_file(key, dst=root / rel)
        taken[lot] = len(keys)
    return taken


def _append_new_lines(path: Path, data: bytes) -> None:
    """Append to the JSONL file ``path`` each complete line of ``data`` it lacks, in order."""
    have = set(path.read_bytes().splitlines()) if path.is_file() else set()
    lines = data.splitlines(keepends=True)
    if lines and not lines[-1].endswith(b"\n"):
        lines = lines[:-1]  # a torn last line: the machine was killed while writing it
    new = [line for line in lines if line.strip() and line.rstrip(b"\n") not in have]
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            f.writelines(new)
