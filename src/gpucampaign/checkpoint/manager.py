"""Full-state checkpoints as transactions.

One checkpoint is a folder ``<run_id>/step-<9 digits>/`` in a ``Store``:

- ``model.safetensors``: the model's weights and buffers;
- ``state.pt``: everything else, loadable with ``torch.load(weights_only=True)``: optimizer,
  LR scheduler, AMP GradScaler, the recipe's state, RNG states (python, numpy as plain
  tensors, torch, cuda), the data cursor (epoch, batches consumed in it, the sampler
  generator's state taken at the TOP of the epoch) and counters: ``TrainState``'s serialized
  attributes (``trainstate.py``), checked against its ``REQUIRED_STATE``;
- ``meta.json``: run ID, config hash, step, the checksum and size of each file (``crc32c``:
  CRC32C, taken while the file is written; metas written before name ``sha256``, still read),
  write/upload seconds. ``LATEST`` pins the meta by its sha256, so a checkpoint is sealed by
  sha256 and each file's bytes are checked against accidental corruption by CRC32C.

A save writes to a temp name, fsyncs, renames (local) or uploads (remote), verifies what the
store holds, and only then moves the ``LATEST`` pointer; the last ``keep`` are kept. A load
refuses a checkpoint with a missing file or component, a failed hash, another run's or
config's meta, or a state file that ``weights_only`` unpickling rejects, and falls back to the
previous good one, saying so.

A restore from a local store maps the files instead of copying them into buffers: the
checksum pass is the read, the weights are views of the mapping until ``load_state_dict``
copies them into the model, and the state's tensors (Adam's moments) stay views of the mapped
state file until the first optimizer step writes them (copy on write) or they move to a GPU.
That is safe because a checkpoint file is never rewritten in place (temp name, rename;
deletions only unlink).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpucampaign.checkpoint.layout import FORMAT, PAYLOAD_FILES, STEP_DIR
from gpucampaign.checkpoint.tensorfiles import safetensors_buffers, save_state, write_hashed
from gpucampaign.checkpoint.trainstate import REQUIRED_STATE
from gpucampaign.checkpoint.verify import (
    MISSING,
    SHA256_MISMATCH,
    CheckpointInvalid,
    check_state,
    check_tensors,
    deserialize,
    fetch_checked,
    file_identity,
)
from gpucampaign.core.errors import InputError
from gpucampaign.core.files import FAST_CHECKSUM, TMP_PREFIX, fsync_dir
from gpucampaign.core.storageurl import is_local
from gpucampaign.folder.layout import (
    CHECKPOINT_LATEST,
    CHECKPOINT_META,
    CHECKPOINT_STATE,
    SPOOL_DIR,
    WEIGHTS_FILE,
    checkpoint_step_dir,
)
from gpucampaign.storage import NotFound, StorageError, Store, StoreUnreachable
from gpucampaign.storage.base import LocalStore
from gpucampaign.storage.open import open_store

log = logging.getLogger(__name__)


# --- writing one checkpoint's files --------------------------------------------
def _write_payload(
    work: Path, *, model_state: dict[str, torch.Tensor], train_state: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Write the model and state files into ``work``; ``{name: {crc32c, bytes}}``.

    The model file is written from the tensors' memory in a second thread while
    ``torch.save`` streams the state file; each is checksummed as it is written.
    """
    files = {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        model_job = pool.submit(
            write_hashed,
            work / WEIGHTS_FILE,
            safetensors_buffers(model_state, metadata={"format": FORMAT}),
            kind=FAST_CHECKSUM,
        )
        digest, size = save_state(work / CHECKPOINT_STATE, train_state, kind=FAST_CHECKSUM)
        files[CHECKPOINT_STATE] = {FAST_CHECKSUM: digest, "bytes": size}
        digest, size = model_job.result()
        files[WEIGHTS_FILE] = {FAST_CHECKSUM: digest, "bytes": size}
    return {name: files[name] for name in PAYLOAD_FILES}


def _commit_local(work: Path, final: Path, *, meta_bytes: bytes) -> None:
    """Add ``meta.json`` to ``work`` and rename it to ``final``, durably."""
    write_hashed(work / CHECKPOINT_META, meta_bytes)  # fsynced like the rest
    fsync_dir(work)
    if final.exists():  # a refused checkpoint of the same step: replace it
        shutil.rmtree(final)
    os.rename(work, final)
    fsync_dir(final.parent)


# --- results ------------------------------------------------------------------------------
@dataclass
class SavedCheckpoint:
    """What one save did and cost."""

    step: int
    key: str
    write_s: float
    upload_s: float
    commit_s: float
    bytes: int
    files: dict[str, dict[str, Any]]
    prune_s: float = 0.0

    @property
    def durable_s(self) -> float:
        """Until the checkpoint is safe and LATEST points at it: write + upload + verify/commit."""
        return self.write_s + self.upload_s + self.commit_s

    @property
    def save_s(self) -> float:
        """The stall the save caused: ``durable_s`` + deleting checkpoints beyond ``keep``."""
        return self.durable_s + self.prune_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "durable_s": self.durable_s, "save_s": self.save_s}


@dataclass
class LoadedCheckpoint:
    """A verified checkpoint, deserialized on CPU."""

    step: int
    key: str
    meta: dict[str, Any]
    model_state: dict[str, torch.Tensor]
    train_state: dict[str, Any]
    read_s: float
    refused: list[str] = field(default_factory=list)


# --- the manager ---------------------------------------------------------------------------
class CheckpointManager:
    """Save and restore one run's checkpoints in a store.

    Args:
        store: Where checkpoints live.
        run_id: The run; its folder in the store is ``<run_id>/``.
        config_sha256: Full hash of the resolved config (+ corpus); a checkpoint whose meta
            names another one is never restored.
        keep: How many committed checkpoints to keep.
        staging_dir: Local folder for files of a remote store before upload.
        expect_tensors: The model's tensors by name with their shapes; a checkpoint whose
            weights lack one, add one or change a shape is refused like a missing one.
    """

    def __init__(
        self,
        store: Store,
        *,
        run_id: str,
        config_sha256: str,
        keep: int = 3,
        staging_dir: Path | None = None,
        expect_tensors: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        assert keep >= 1
        self.expect_tensors = expect_tensors
        self.store = store
        self.run_id = run_id
        self.config_sha256 = config_sha256
        self.keep = keep
        self.staging_dir = staging_dir

    # keys
    def _key(self, *parts: str) -> str:
        return "/".join((self.run_id, *parts))

    def step_dirs(self) -> list[int]:
        """Steps of every checkpoint folder present (committed or not), ascending."""
        steps = set()
        for key in self.store.list(self.run_id):
            parts = key.split("/")
            if len(parts) == 3 and (m := STEP_DIR.match(parts[1])):
                steps.add(int(m.group(1)))
        return sorted(steps)

    def latest_pointer(self) -> dict[str, Any] | None:
        """The parsed ``LATEST`` pointer; ``None`` when absent. Raises ``CheckpointInvalid``."""
        try:
            raw = self.store.read_bytes(self._key(CHECKPOINT_LATEST))
        except NotFound:
            return None
        try:
            ptr = json.loads(raw)
            int(ptr["step"])
            str(ptr["meta_sha256"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointInvalid(
                self._key(CHECKPOINT_LATEST), f"unreadable pointer ({exc})"
            ) from None
        return ptr

    def has_any(self) -> bool:
        """True when the store holds a pointer or a checkpoint folder for this run."""
        return self.store.exists(self._key(CHECKPOINT_LATEST)) or bool(self.step_dirs())

    # save
    def save(
        self,
        step: int,
        *,
        model_state: dict[str, torch.Tensor],
        train_state: dict[str, Any],
        extra_meta: dict[str, Any] | None = None,
    ) -> SavedCheckpoint:
        """Save a checkpoint of ``step`` as a transaction and move ``LATEST`` to it.

        The files are written under a temp name with fsync, then renamed (local store) or
        uploaded (remote store); what the store holds is verified, and only then does
        ``LATEST`` move. Checkpoints beyond ``keep`` are deleted afterwards.

        Args:
            step: The global step the state belongs to.
            model_state: The model's ``state_dict``.
            train_state: Every component of ``REQUIRED_STATE``.
            extra_meta: More fields for ``meta.json``.

        Returns:
            What the save did and what each part cost.

        Raises:
            StorageError: A write, upload or verification failed; ``LATEST`` did not move.
        """
        missing = [k for k in REQUIRED_STATE if k not in train_state]
        assert not missing, f"train_state lacks {missing}"
        dirname = checkpoint_step_dir(step)
        final_key = self._key(dirname)
        t0 = time.perf_counter()
        local_final = self.store.local_path(final_key)
        work = self._work_dir(dirname, local_final=local_final)
        try:
            work.mkdir(parents=True, exist_ok=True)
            files = _write_payload(work, model_state=model_state, train_state=train_state)
            write_s = time.perf_counter() - t0
            upload_s = 0.0 if local_final is not None else self._upload(work, final_key, files)
            meta_bytes = self._meta_bytes(
                step, files=files, write_s=write_s, upload_s=upload_s, extra_meta=extra_meta
            )
            t2 = time.perf_counter()
            if local_final is not None:
                _commit_local(work, local_final, meta_bytes=meta_bytes)
            else:
                self.store.write_bytes(f"{final_key}/{CHECKPOINT_META}", data=meta_bytes)
            self._verify_stored(final_key, files, meta_bytes)
            self._move_latest(step, meta_bytes)
            commit_s = time.perf_counter() - t2
            self._prune(step)
            prune_s = time.perf_counter() - t2 - commit_s
        except StorageError:
            raise
        except OSError as exc:  # a full disk, an I/O error: name the checkpoint, keep LATEST
            raise StorageError(
                f"checkpoint {final_key} was not saved ({exc}); {CHECKPOINT_LATEST} still "
                "names the previous one"
            ) from exc
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
        return SavedCheckpoint(
            step=step,
            key=final_key,
            write_s=write_s,
            upload_s=upload_s,
            commit_s=commit_s,
            bytes=sum(f["bytes"] for f in files.values()),
            files=files,
            prune_s=prune_s,
        )

    def _work_dir(self, dirname: str, *, local_final: Path | None) -> Path:
        """The temp folder the files are written in: beside the final one in a local store
        (so a rename commits it), else in the staging folder before upload."""
        if local_final is not None:
            return local_final.parent / f"{TMP_PREFIX}{dirname}-{uuid.uuid4().hex[:8]}"
        base = self.staging_dir or Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{dirname}-", dir=base))

    def _upload(self, work: Path, final_key: str, files: dict[str, dict[str, Any]]) -> float:
        """Upload the payload files to a remote store (with the hashes taken as they were
        written); returns the seconds it took."""
        t0 = time.perf_counter()
        for name in PAYLOAD_FILES:
            # The store's own sha256 (an S3 object's metadata) is taken while uploading.
            sha256 = files[name].get("sha256")
            self.store.put_file(f"{final_key}/{name}", src=work / name, sha256=sha256)
        return time.perf_counter() - t0

    def _meta_bytes(
        self,
        step: int,
        *,
        files: dict[str, dict[str, Any]],
        write_s: float,
        upload_s: float,
        extra_meta: dict[str, Any] | None,
    ) -> bytes:
        """The content of ``meta.json``: whose checkpoint it is, and each file's hash and size."""
        meta = {
            "format": FORMAT,
            "run_id": self.run_id,
            "config_sha256": self.config_sha256,
            "step": step,
            "files": files,
            "write_s": write_s,
            "upload_s": upload_s,
            "torch": torch.__version__,
            "created_unix": time.time(),
            **(extra_meta or {}),
        }
        return (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()

    def _move_latest(self, step: int, meta_bytes: bytes) -> None:
        """Point ``LATEST`` at the checkpoint of ``step``, pinning its meta's hash."""
        pointer = {
            "step": step,
            "dir": checkpoint_step_dir(step),
            "meta_sha256": hashlib.sha256(meta_bytes).hexdigest(),
        }
        self.store.write_bytes(self._key(CHECKPOINT_LATEST), data=json.dumps(pointer).encode())

    def _verify_stored(
        self, final_key: str, files: dict[str, dict[str, Any]], meta_bytes: bytes
    ) -> None:
        """Raise ``StorageError`` unless the store holds every file as written."""
        for name, info in files.items():
            size = self.store.size(f"{final_key}/{name}")
            if size != info["bytes"]:
                raise StorageError(
                    f"{final_key}/{name}: store holds {size} bytes, wrote {info['bytes']}"
                )
        if self.store.read_bytes(f"{final_key}/{CHECKPOINT_META}") != meta_bytes:
            raise StorageError(
                f"{final_key}/{CHECKPOINT_META}: store does not hold what was written"
            )

    def _prune(self, latest: int) -> None:
        """Keep the ``keep`` newest checkpoints up to ``latest``; drop the rest and stale temps."""
        steps = self.step_dirs()
        kept = [s for s in steps if s <= latest][-self.keep :]
        for s in steps:
            if s not in kept:
                self.delete(s)
        run_dir = self.store.local_path(self.run_id)
        if run_dir is not None and run_dir.is_dir():
            for p in run_dir.iterdir():
                if p.name.startswith(TMP_PREFIX) and p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)

    def delete(self, step: int) -> None:
        """Delete the checkpoint folder of ``step``."""
        for key in self.store.list(self._key(checkpoint_step_dir(step))):
            self.store.delete(key)

    # load
    def load(self, step: int, *, meta_sha256: str | None = None) -> LoadedCheckpoint:
        """Load and fully verify the checkpoint of ``step``.

        Args:
            step: The checkpoint's step.
            meta_sha256: The hash ``LATEST`` pins for its meta, when loading its target.

        Returns:
            The checkpoint, deserialized on CPU.

        Raises:
            CheckpointInvalid: Any check failed (the reason names it).
        """
        key = self._key(checkpoint_step_dir(step))
        t0 = time.perf_counter()
        meta = self._read_meta(key, step=step, meta_sha256=meta_sha256)
        blobs, stats = self._fetch(key, files=meta["files"])
        state_path = (
            self.store.local_path(f"{key}/{CHECKPOINT_STATE}")
            if CHECKPOINT_STATE in stats
            else None
        )
        model_state, train_state = deserialize(key, blobs, state_path=state_path)
        if state_path is not None and file_identity(state_path.stat()) != stats[CHECKPOINT_STATE]:
            raise CheckpointInvalid(key, f"{CHECKPOINT_STATE} was replaced while it was read")
        check_tensors(key, model_state, expected=self.expect_tensors)
        check_state(key, train_state, step=step)
        return LoadedCheckpoint(
            step=step,
            key=key,
            meta=meta,
            model_state=model_state,
            train_state=train_state,
            read_s=time.perf_counter() - t0,
        )

    def _read_meta(self, key: str, *, step: int, meta_sha256: str | None) -> dict[str, Any]:
        """``meta.json`` of ``key``, refused unless it is this run's and config's, of ``step``."""
        try:
            meta_bytes = self.store.read_bytes(f"{key}/{CHECKPOINT_META}")
        except NotFound:
            raise CheckpointInvalid(
                key, f"{CHECKPOINT_META} is missing", MISSING, f"{key}/{CHECKPOINT_META}"
            ) from None
        got = hashlib.sha256(meta_bytes).hexdigest()
        if meta_sha256 is not None and got != meta_sha256:
            raise CheckpointInvalid(
                key,
                f"{CHECKPOINT_META} does not match the hash in {CHECKPOINT_LATEST} "
                f"(sha256 {got}, {CHECKPOINT_LATEST} pins {meta_sha256})",
                SHA256_MISMATCH,
                f"{key}/{CHECKPOINT_META}",
                meta_sha256,
                got,
            )
        try:
            meta = json.loads(meta_bytes)
        except ValueError as exc:
            raise CheckpointInvalid(key, f"{CHECKPOINT_META} is not JSON ({exc})") from None
        if meta.get("format") != FORMAT:
            raise CheckpointInvalid(key, f"unknown format {meta.get('format')!r}")
        if meta.get("run_id") != self.run_id or meta.get("config_sha256") != self.config_sha256:
            raise CheckpointInvalid(
                key,
                f"it belongs to run {meta.get('run_id')!r} / config "
                f"{str(meta.get('config_sha256'))[:10]}, "
                f"not {self.run_id} / {self.config_sha256[:10]}",
            )
        if meta.get("step") != step:
            raise CheckpointInvalid(key, f"meta says step {meta.get('step')}, folder says {step}")
        lacking = [n for n in PAYLOAD_FILES if n not in meta.get("files", {})]
        if lacking:
            raise CheckpointInvalid(key, f"meta lists no {lacking}")
        return meta

    def fetch_payload(self, key: str, *, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The payload files of ``key``, each checked for size and checksum: buffers, or
        private mappings of the files in a local store."""
        return self._fetch(key, files=files)[0]

    def _fetch(
        self, key: str, *, files: dict[str, dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
        """The checked payload files of ``key`` and, for those mapped from a local store,
        the identity (device, inode, size, mtime) of the file that was checked."""

        def fetch(name: str) -> tuple[str, Any, tuple[int, ...] | None]:
            data, stat = fetch_checked(self.store, key, name, want=files[name])
            return name, data, stat

        with ThreadPoolExecutor(max_workers=len(PAYLOAD_FILES)) as pool:
            fetched = list(pool.map(fetch, PAYLOAD_FILES))
        blobs = {name: data for name, data, _ in fetched}
        stats = {name: stat for name, _, stat in fetched if stat is not None}
        return blobs, stats

    def load_latest(
        self, *, max_step: int | None = None
    ) -> tuple[LoadedCheckpoint | None, list[str]]:
        """The newest good checkpoint and the reasons others were refused.

        Tries ``LATEST``'s target, then older kept checkpoints, newest first. Folders newer than
        ``LATEST`` were never committed and are ignored. Without a readable pointer every
        folder is tried (each is verified by its hashes anyway).

        Args:
            max_step: Only consider checkpoints at or before this step.

        Returns:
            ``(checkpoint or None, refusals)``; ``(None, [])`` when the run has none at all.
        """
        refused: list[str] = []
        try:
            ptr = self.latest_pointer()
        except CheckpointInvalid as exc:
            refused.append(str(exc))
            ptr = None
        steps = self.step_dirs()
        if ptr is not None:
            top = int(ptr["step"])
            candidates = [top] + [s for s in reversed(steps) if s < top]
        else:
            candidates = list(reversed(steps))
        if max_step is not None:
            candidates = [s for s in candidates if s <= max_step]
        for s in candidates:
            try:
                pinned = ptr["meta_sha256"] if ptr and s == int(ptr["step"]) else None
                ck = self.load(s, meta_sha256=pinned)
            except StoreUnreachable:
                raise  # the store did not answer: not a reason to take an older checkpoint
            except (CheckpointInvalid, StorageError) as exc:
                reason = (
                    str(exc)
                    if isinstance(exc, CheckpointInvalid)
                    else f"checkpoint step {s}: {exc}"
                )
                log.warning("%s; trying the previous one", reason)
                refused.append(reason)
                continue
            ck.refused = refused
            if refused:
                log.warning(
                    "run %s resumes from the checkpoint of step %d (%d refused)",
                    self.run_id,
                    s,
                    len(refused),
                )
            return ck, refused
        return None, refused


def durable_step(url: str, *, out: str | Path, run_id: str) -> int | None:
    """The step ``LATEST`` names for ``run_id`` now, read at once (a resume restores it).

    A process killed after moving ``LATEST`` but before saying so anywhere else leaves its
    records one save behind; this is what the next start will really restore. A spooled
    pointer (S3 down at the save) wins over the server's, as in ``SpoolingStore``. ``None``
    when there is no pointer or it cannot be read now: the caller keeps what it recorded.
    """
    key = f"{run_id}/{CHECKPOINT_LATEST}"
    stores: list[Store] = []
    if not is_local(url):
        stores.append(LocalStore(Path(out) / SPOOL_DIR))
    try:
        stores.append(open_store(url, out=out, spool=False, read_wait_s=0))
        for store in stores:
            if store.exists(key):
                return int(json.loads(store.read_bytes(key))["step"])
    except (StorageError, InputError, OSError, ValueError, KeyError, TypeError):
        return None
    return None
