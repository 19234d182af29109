"""One writer per output folder: an advisory lock on ``OUT/.lock`` for the whole campaign.

``campaign run`` and the deployment flow hold it from before the first write to the end; a
second writer is refused at once with the holder named (PID, host, since when). The lock is
``fcntl.flock`` on the file, which the kernel releases when its holder dies; the file keeps the
holder's PID and host as JSON, so a refusal can say who holds it. A holder recorded on this
host whose PID no longer runs (a crash; or the lock kept only by a forked child it left
behind) is taken over, with a note. Contenders that start at once take turns under a short
``flock`` on the folder itself, so a takeover is atomic: exactly one of them gets the folder,
the others are refused naming it. ``campaign expense`` does not take this lock: it appends
one line to the append-only ledger under the ledger's own short lock, while a campaign runs
or after.

The lock file is not part of the campaign's output: the manifest and ``verify`` leave it out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucampaign.config import SpecError
from gpucampaign.core.files import utc_now
from gpucampaign.folder.layout import LOCK_FILE

# The folders this process holds, by resolved path: the CLI takes the lock before Prefect
# starts and the flow, in the same process, takes it again (a second flock on a new open file
# would conflict with our own).
_HELD: dict[Path, _Held] = {}

#: How long a contender waits for another that is taking the lock at the same moment.
_TAKING_WAIT_S = 10.0


@dataclass
class _Held:
    fd: int
    depth: int
    note: str | None


class FolderLocked(SpecError):
    """Another process writes this output folder (CLI exit 2)."""

    def __init__(self, root: Path, holder: dict[str, Any]) -> None:
        since = holder.get("since") or "an unknown time"
        who = f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        what = f" ({holder['what']})" if holder.get("what") else ""
        super().__init__(
            f"Output folder '{root}' is being written by another campaign: {who}{what}, since "
            f"{since} (lock file {root / LOCK_FILE}). One folder has one writer: wait for it "
            "to end, stop it, or give this campaign another --out.",
            field="out",
        )
        self.holder = holder


def pid_runs(pid: Any) -> bool:
    """Whether process ``pid`` runs on this host (a zombie counts as gone: its files, and so
    its locks, are already closed)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, as another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def read_holder(root: str | Path) -> dict[str, Any]:
    """What the lock file says of its last holder (``{}`` when none or unreadable)."""
    try:
        data = json.loads((Path(root) / LOCK_FILE).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _open_lock(path: Path) -> int:
    # O_NOFOLLOW: a link planted as the lock file is not followed out of the folder.
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _cannot_lock(root: Path, path: Path, exc: OSError) -> SpecError:
    return SpecError(
        f"cannot lock output folder '{root}' ({path}: {exc.strerror}); give another --out.",
        field="out",
    )


@contextlib.contextmanager
def _taking(root: Path) -> Iterator[bool]:
    """Serialize taking the lock of ``root`` among the processes that try at once: an
    exclusive ``flock`` on the folder itself, held only while a contender takes the lock file
    (or takes it over) and writes its record. Yields False where the file system refuses locks
    on a folder (then no stale lock is taken over: the takeover needs the guard)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot_lock(root, root, exc) from None
    try:
        deadline = time.monotonic() + _TAKING_WAIT_S
        while True:
            try:
                guarded = _try_flock(fd)
            except OSError:
                guarded = False
                break
            if guarded:
                break
            if time.monotonic() > deadline:  # a process that froze while taking it
                raise FolderLocked(root, read_holder(root))
            time.sleep(0.005)
        yield guarded
    finally:
        os.close(fd)  # releases the guard


def _is_current(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (a takeover replaces the file)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _acquire(root: Path, *, what: str) -> tuple[int, str | None]:
    """Take the lock of ``root``; ``(fd, note)`` where the note says whom it took over from.

    The contenders take turns (``_taking``): the holder's record is written before the next
    contender looks, so a record naming a dead process is that of a holder that really died,
    never of a winner that has not written its own yet, and a takeover replaces no file that
    someone has just locked.
    """
    path = root / LOCK_FILE
    with _taking(root) as guarded:
        previous = read_holder(root)
        for _ in range(3):  # a takeover replaces the file once; the next open gets the new one
            try:
                fd = _open_lock(path)
            except OSError as exc:
                raise _cannot_lock(root, path, exc) from None
            if _try_flock(fd):
                if _is_current(fd, path):
                    break
                os.close(fd)  # someone else replaced the file after we opened it: open again
                continue
            os.close(fd)
            holder = read_holder(root)
            if (
                not guarded
                or holder.get("host") != socket.gethostname()
                or pid_runs(holder.get("pid"))
            ):
                raise FolderLocked(root, holder)
            # Held, but its recorded holder is dead on this host (a child it left keeps the
            # open file): a new lock file, so the old one no longer counts.
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        else:
            raise FolderLocked(root, read_holder(root))
        note = None
        if previous.get("pid") not in (None, os.getpid()) and not pid_runs(previous.get("pid")):
            note = (
                f"took over the lock of output folder '{root}' from PID {previous.get('pid')} "
                f"on {previous.get('host', '?')} (since {previous.get('since', '?')}), whose "
                "process is gone"
            )
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": utc_now(),
            "what": what,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
    return fd, note


@contextlib.contextmanager
def writer_lock(root: str | Path, *, what: str = "campaign run") -> Iterator[str | None]:
    """Hold the one-writer lock of the output folder ``root`` (created if needed).

    Re-entrant within a process (the CLI and the flow it runs share it). Yields the note of a
    take-over from a dead holder, or None.

    Raises:
        FolderLocked: Another live process holds it; the message names it.
    """
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    held = _HELD.get(key)
    if held is not None:
        held.depth += 1
        try:
            yield held.note
        finally:
            held.depth -= 1
        return
    fd, note = _acquire(folder, what=what)
    _HELD[key] = _Held(fd=fd, depth=1, note=note)
    try:
        yield note
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no holder any more; the file stays (see _acquire)
        os.close(fd)
