"""Checkpoints as transactions: full state, hashes, fallback to the previous good one, refusals."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.checkpoint.state import capture_rng, restore_rng
from gpucampaign.checkpoint.trainstate import (
    MODEL,
    REQUIRED_STATE,
    SERIALIZED_ATTRIBUTES,
    TrainState,
)
from gpucampaign.checkpoint.verify import CheckpointInvalid
from gpucampaign.config import SpecError
from gpucampaign.folder.layout import (
    CHECKPOINT_LATEST,
    CHECKPOINT_META,
    CHECKPOINT_STATE,
    WEIGHTS_FILE,
    checkpoint_step_dir,
)
from gpucampaign.storage import (
    LocalStore,
    S3Store,
    StorageError,
    check_key,
    check_storage,
    open_store,
)
from tests.helpers import digits_file, make_spec, run, run_dir, train_losses  # noqa: F401

RUN = "control-0123456789"
CFG = "ab" * 32


def _state(step: int, *, seed: int = 0) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    model = {"w": torch.randn(8, 4, generator=g), "b": torch.zeros(4)}
    state = {
        "optimizer": {
            "state": {
                0: {"exp_avg": torch.randn(8, 4, generator=g), "step": torch.tensor(float(step))}
            },
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0]}],
        },
        "scheduler": {"last_epoch": step, "base_lrs": [0.1]},
        "scaler": {},
        "rng": capture_rng(),
        "cursor": {"epoch": 0, "batch_in_epoch": step, "epoch_generator_state": g.get_state()},
        "counters": {"global_step": step},
    }
    return model, state


def _manager(root: Path, *, keep: int = 3, store=None) -> CheckpointManager:
    return CheckpointManager(store or LocalStore(root), run_id=RUN, config_sha256=CFG, keep=keep)


def _file(root: Path, step: int, name: str) -> Path:
    return root / RUN / checkpoint_step_dir(step) / name


def test_save_and_load_round_trip(tmp_path):
    m = _manager(tmp_path)
    model, state = _state(3)
    saved = m.save(3, model_state=model, train_state=state, extra_meta={"planned_steps": 10})
    assert saved.save_s >= saved.write_s > 0 and saved.upload_s == 0
    meta = json.loads(_file(tmp_path, 3, CHECKPOINT_META).read_text())
    for name in (WEIGHTS_FILE, CHECKPOINT_STATE):
        data = _file(tmp_path, 3, name).read_bytes()
        assert meta["files"][name] == {"crc32c": _crc32c(data), "bytes": len(data)}
    assert meta["run_id"] == RUN and meta["config_sha256"] == CFG and meta["step"] == 3
    assert meta["planned_steps"] == 10 and meta["write_s"] > 0
    ptr = json.loads((tmp_path / RUN / CHECKPOINT_LATEST).read_text())
    assert ptr["step"] == 3
    ck, refused = m.load_latest()
    assert refused == [] and ck.step == 3
    assert all(torch.equal(ck.model_state[k], model[k]) for k in model)
    assert torch.equal(
        ck.train_state["optimizer"]["state"][0]["exp_avg"],
        state["optimizer"]["state"][0]["exp_avg"],
    )
    assert ck.train_state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)


def _crc32c(data: bytes) -> str:
    from awscrt.checksums import crc32c

    return f"{crc32c(data):08x}"


@pytest.mark.parametrize("name", [WEIGHTS_FILE, CHECKPOINT_STATE])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_flipped_byte_is_refused_by_the_fast_checksum(tmp_path, name, where):
    m = _two(tmp_path)
    p = _file(tmp_path, 4, name)
    data = bytearray(p.read_bytes())
    at = {"first": 0, "middle": len(data) // 2, "last": len(data) - 1}[where]
    data[at] ^= 0xFF  # same size, one byte changed
    p.write_bytes(bytes(data))
    ck, refused = m.load_latest()
    assert ck.step == 2 and len(refused) == 1
    assert name in refused[0] and "fails its crc32c" in refused[0]


def _as_old_sha256_meta(root: Path, step: int) -> None:
    """Rewrite a checkpoint's meta the way it was written before CRC32C: ``sha256`` per file."""
    meta_path = _file(root, step, CHECKPOINT_META)
    meta = json.loads(meta_path.read_text())
    for name in (WEIGHTS_FILE, CHECKPOINT_STATE):
        data = _file(root, step, name).read_bytes()
        meta["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    meta_path.write_bytes(meta_bytes)
    latest = root / RUN / CHECKPOINT_LATEST
    ptr = json.loads(latest.read_text())
    if ptr["step"] == step:
        ptr["meta_sha256"] = hashlib.sha256(meta_bytes).hexdigest()
        latest.write_text(json.dumps(ptr))


def test_a_checkpoint_with_a_sha256_meta_still_loads_and_is_checked(tmp_path):
    m = _two(tmp_path)
    _as_old_sha256_meta(tmp_path, 4)
    ck, refused = m.load_latest()
    assert refused == [] and ck.step == 4
    assert torch.equal(ck.model_state["w"], _state(4, seed=4)[0]["w"])
    p = _file(tmp_path, 4, CHECKPOINT_STATE)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    ck, refused = m.load_latest()
    assert ck.step == 2 and "fails its sha256" in refused[0]


def test_a_meta_without_a_checksum_is_refused(tmp_path):
    m = _two(tmp_path)
    meta_path = _file(tmp_path, 4, CHECKPOINT_META)
    meta = json.loads(meta_path.read_text())
    meta["files"][WEIGHTS_FILE].pop("crc32c")
    meta_path.write_text(json.dumps(meta))
    ck, refused = m.load_latest()
    assert ck.step == 2 and "LATEST" in refused[0]  # the pin on the meta refuses it first
    with pytest.raises(CheckpointInvalid, match="no checksum"):
        m.load(4)


def test_pins_and_seals_still_use_sha256(tmp_path):
    """The fast checksum is for checkpoint files only: LATEST pins its meta by sha256, and the
    corpus reference of the manifest (its pin) is a sha256."""
    from gpucampaign.close.manifest import reference_corpus
    from gpucampaign.data.pins import input_sha256

    _two(tmp_path)
    ptr = json.loads((tmp_path / RUN / CHECKPOINT_LATEST).read_text())
    meta_bytes = _file(tmp_path, 4, CHECKPOINT_META).read_bytes()
    assert ptr["meta_sha256"] == hashlib.sha256(meta_bytes).hexdigest()
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("text,label\na,0\n")
    ref = reference_corpus(tmp_path / "out", corpus)
    assert ref["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert input_sha256(corpus) == ref["sha256"]


def _rng_draws() -> tuple[float, float, float]:
    """The next number of each global generator, drawn from a copy of its state: a thread left
    by an earlier test in the same worker may draw from the global ones at any time."""
    python = random.Random()
    python.setstate(random.getstate())
    numpy = np.random.RandomState()
    numpy.set_state(np.random.get_state())
    torch_gen = torch.Generator()
    torch_gen.set_state(torch.get_rng_state())
    return python.random(), numpy.rand(), torch.rand(1, generator=torch_gen).item()


def test_rng_states_round_trip_through_weights_only(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = capture_rng()
    buf = io.BytesIO()
    torch.save(saved, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    expected = _rng_draws()
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    assert _rng_draws() != expected
    restore_rng(loaded)
    assert _rng_draws() == expected


def test_keeps_the_last_k(tmp_path):
    m = _manager(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        m.save(step, model_state=_state(step)[0], train_state=_state(step)[1])
    assert m.step_dirs() == [3, 4]
    assert json.loads((tmp_path / RUN / CHECKPOINT_LATEST).read_text())["step"] == 4


def _two(tmp_path: Path) -> CheckpointManager:
    m = _manager(tmp_path)
    for step in (2, 4):
        model, state = _state(step, seed=step)
        m.save(step, model_state=model, train_state=state)
    return m


def test_truncated_checkpoint_falls_back(tmp_path):
    m = _two(tmp_path)
    p = _file(tmp_path, 4, CHECKPOINT_STATE)
    p.write_bytes(p.read_bytes()[:100])
    ck, refused = m.load_latest()
    assert (
        ck.step == 2
        and len(refused) == 1
        and "truncated" in refused[0]
        and CHECKPOINT_STATE in refused[0]
    )


def test_tampered_checkpoint_falls_back(tmp_path):
    m = _two(tmp_path)
    p = _file(tmp_path, 4, WEIGHTS_FILE)
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x01  # same size, one bit changed in the weights
    p.write_bytes(bytes(data))
    ck, refused = m.load_latest()
    assert ck.step == 2 and "altered" in refused[0]
    assert torch.equal(ck.model_state["w"], _state(2, seed=2)[0]["w"])


def test_missing_file_or_tampered_meta_falls_back(tmp_path):
    m = _two(tmp_path)
    _file(tmp_path, 4, CHECKPOINT_STATE).unlink()
    ck, refused = m.load_latest()
    assert ck.step == 2 and "missing" in refused[0]
    m2 = _two(tmp_path / "b")
    meta = _file(tmp_path / "b", 4, CHECKPOINT_META)
    meta.write_text(meta.read_text().replace('"step": 4', '"step":  4'))
    ck, refused = m2.load_latest()
    assert ck.step == 2 and "LATEST" in refused[0]


def _replace_state(root: Path, step: int, payload: bytes) -> None:
    """Write ``payload`` as the state file and make meta and LATEST agree with it, so only
    the content (not a hash) can refuse it."""
    _file(root, step, CHECKPOINT_STATE).write_bytes(payload)
    meta_path = _file(root, step, CHECKPOINT_META)
    meta = json.loads(meta_path.read_text())
    meta["files"][CHECKPOINT_STATE] = {
        "sha256": hashlib.sha256(payload).hexdigest(),
        "bytes": len(payload),
    }
    meta_bytes = json.dumps(meta).encode()
    meta_path.write_bytes(meta_bytes)
    latest = root / RUN / CHECKPOINT_LATEST
    ptr = json.loads(latest.read_text())
    if ptr["step"] == step:
        ptr["meta_sha256"] = hashlib.sha256(meta_bytes).hexdigest()
        latest.write_text(json.dumps(ptr))


class _Payload:
    """A pickle that would create a file when unpickled (a stand-in for arbitrary code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_with_a_payload_is_refused(tmp_path):
    m = _two(tmp_path)
    marker = tmp_path / "pwned"
    _, state = _state(4)
    state["counters"] = {"global_step": 4, "evil": _Payload(marker)}
    buf = io.BytesIO()
    torch.save(state, buf)
    _replace_state(tmp_path, 4, buf.getvalue())
    ck, refused = m.load_latest()
    assert ck.step == 2 and "weights_only" in refused[0]
    assert not marker.exists()
    # The payload is live: a plain unpickler runs it.
    torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert marker.exists()


_REQUIRED = [(comp, None) for comp in REQUIRED_STATE] + [
    (comp, sub) for comp, subs in REQUIRED_STATE.items() for sub in subs
]


@pytest.mark.parametrize(("comp", "sub"), _REQUIRED, ids=lambda v: v or "")
def test_a_state_without_a_required_key_is_refused(tmp_path, comp, sub):
    m = _two(tmp_path)
    _, state = _state(4)
    if sub is None:
        del state[comp]
    else:
        del state[comp][sub]
    buf = io.BytesIO()
    torch.save(state, buf)
    _replace_state(tmp_path, 4, buf.getvalue())
    ck, refused = m.load_latest()
    why = f"'{comp}' is missing" if sub is None else f"'{comp}' lacks ['{sub}']"
    assert ck.step == 2 and why in refused[0]


class _Recipe:
    """A recipe's own state: a count kept in every checkpoint."""

    def __init__(self) -> None:
        self.calls = 0

    def state_dict(self) -> dict:
        return {"calls": torch.tensor(self.calls)}

    def load_state_dict(self, state: dict) -> None:
        self.calls = int(state["calls"])


def _train_state(seed: int) -> tuple[TrainState, DataLoader]:
    """A small TrainState (Adam, a step scheduler) and its loader of 3 batches per epoch."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(seed)
    state = TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=2),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        recipe=_Recipe(),
        generator=generator,
    )
    data = TensorDataset(torch.arange(48, dtype=torch.float32).reshape(12, 4))
    return state, DataLoader(data, batch_size=4, shuffle=True, generator=generator)


def _same(a, b, path: str = "") -> None:
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


def test_the_train_state_round_trips_every_required_key(tmp_path):
    """``state_dict`` holds every key the manager requires; a checkpoint of it, loaded into a
    fresh state, gives back the same ``state_dict`` once the resumed epoch starts."""
    state, loader = _train_state(seed=0)
    for _ in range(2):  # an epoch and a third, so the cursor is mid-epoch
        batches = state.start_epoch(loader)
        while state.batch_in_epoch < len(loader) and state.global_step < 4:
            (x,) = next(batches)
            state.optimizer.zero_grad()
            state.model(x).square().mean().backward()
            state.optimizer.step()
            state.scheduler.step()
            state.recipe.calls += 1
            state.global_step += 1
            state.batch_in_epoch += 1
            state.samples_seen += len(x)
            state.steps_s_sum += 0.25
        if state.batch_in_epoch == len(loader):
            state.epoch += 1
    saved = state.state_dict()
    assert list(saved) == [MODEL, *SERIALIZED_ATTRIBUTES]
    for comp, subs in REQUIRED_STATE.items():
        assert all(s in saved[comp] for s in subs), comp
    assert (saved["cursor"]["epoch"], saved["cursor"]["batch_in_epoch"]) == (1, 1)

    m = _manager(tmp_path)
    train_state = dict(saved)
    m.save(4, model_state=train_state.pop(MODEL), train_state=train_state)
    ck = m.load(4)
    fresh, fresh_loader = _train_state(seed=1)
    fresh.load_state_dict({MODEL: ck.model_state, **ck.train_state})
    fresh.start_epoch(fresh_loader)  # the generator and the global RNGs come back here
    _same(saved, fresh.state_dict())


def test_nothing_usable(tmp_path):
    m = _manager(tmp_path)
    assert m.load_latest() == (None, []) and not m.has_any()
    m.save(2, model_state=_state(2)[0], train_state=_state(2)[1])
    _file(tmp_path, 2, WEIGHTS_FILE).write_bytes(b"")
    ck, refused = m.load_latest()
    assert ck is None and len(refused) == 1 and m.has_any()


def test_other_run_or_config_is_refused(tmp_path):
    _two(tmp_path)
    other = CheckpointManager(LocalStore(tmp_path), run_id=RUN, config_sha256="cd" * 32)
    ck, refused = other.load_latest()
    assert ck is None and all("belongs to run" in r for r in refused)


def test_unfinished_saves_are_ignored_and_cleaned(tmp_path):
    m = _two(tmp_path)
    crashed = tmp_path / RUN / ".tmp-step-000000006-deadbeef"  # a save killed before its rename
    crashed.mkdir()
    (crashed / WEIGHTS_FILE).write_bytes(b"partial")
    uncommitted = tmp_path / RUN / checkpoint_step_dir(8)  # renamed, but LATEST never moved
    import shutil

    shutil.copytree(tmp_path / RUN / checkpoint_step_dir(4), uncommitted)
    ck, _ = m.load_latest()
    assert ck.step == 4  # LATEST decides, not the newest folder
    assert not any(".tmp-" in k for k in LocalStore(tmp_path).list(RUN))
    m.save(6, model_state=_state(6)[0], train_state=_state(6)[1])
    assert not crashed.exists() and m.step_dirs() == [2, 4, 6]


class StagedStore(LocalStore):
    """A real store that, like a remote one, offers no local path: files are staged and uploaded."""

    def local_path(self, key: str) -> Path | None:
        return None


def test_remote_style_store_uploads_then_commits(tmp_path):
    store = StagedStore(tmp_path / "remote")
    m = CheckpointManager(store, run_id=RUN, config_sha256=CFG, staging_dir=tmp_path / "staging")
    model, state = _state(5)
    saved = m.save(5, model_state=model, train_state=state)
    assert saved.upload_s > 0 and not any((tmp_path / "staging").iterdir())
    assert store.exists(f"{RUN}/{checkpoint_step_dir(5)}/{CHECKPOINT_STATE}")
    ck, refused = m.load_latest()
    assert ck.step == 5 and not refused and torch.equal(ck.model_state["w"], model["w"])


def test_store_keys_cannot_escape(tmp_path):
    store = LocalStore(tmp_path / "root")
    for bad in ("../x", "/etc/passwd", "a/../../x", "", "a//b", "a\\b", "./a"):
        with pytest.raises(StorageError):
            check_key(bad)
    (tmp_path / "outside").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(StorageError, match="outside"):
        store.write_bytes("link/x", data=b"1")
    store.write_bytes("a/b.txt", data=b"hello")
    assert (
        store.read_bytes("a/b.txt") == b"hello"
        and store.list() == ["a/b.txt"]
        and store.size("a/b.txt") == 5
    )
    store.get_file("a/b.txt", dst=tmp_path / "copy.txt")
    store.put_file("c.txt", src=tmp_path / "copy.txt")
    store.delete("a/b.txt")
    assert store.list() == ["c.txt"] and not (tmp_path / "root" / "a").exists()


def test_open_store(tmp_path):
    assert isinstance(open_store("local", out=tmp_path), LocalStore)
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "very-secret-value",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    s3 = open_store("s3://bucket/some/prefix/", out=tmp_path, env=env, spool=False)
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    spooling = open_store("s3://bucket/some/prefix/", out=tmp_path, env=env)
    assert isinstance(spooling.remote, S3Store) and spooling.url == s3.url
    assert "very-secret" not in repr(spooling) and not (tmp_path / "spool").exists()
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(spooling)
    assert s3.local_path("run/LATEST") is None and "very-secret" not in repr(s3)
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(s3)
    with pytest.raises(SpecError, match="unknown storage"):
        open_store("gs://bucket/prefix", out=tmp_path, env={})
    with pytest.raises(SpecError, match="prefix"):
        open_store("s3://bucket/a/../b", out=tmp_path, env=env)


def test_check_storage_on_a_dead_endpoint_names_the_url_not_the_secret():
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "very-secret-value",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }  # port 9 (discard): nothing listens
    check_storage("local", env=env)
    with pytest.raises(SpecError) as info:
        check_storage("s3://bucket/prefix", env=env)
    text = str(info.value)
    assert "s3://bucket/prefix" in text and "cannot reach" in text
    assert "very-secret" not in text and "AKIDEXAMPLE" not in text


def test_a_run_resumes_from_the_previous_good_checkpoint(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"dropout": 0.1})
    whole = run(spec, tmp_path, out="whole")
    run(spec, tmp_path, stop_after_steps=8, checkpoint_every=3)  # saves at 3, 6, 8
    state = (
        tmp_path
        / "out"
        / "checkpoints"
        / spec.resolve_run("control").run_id
        / checkpoint_step_dir(8)
        / CHECKPOINT_STATE
    )
    state.write_bytes(state.read_bytes()[:-10])
    res = run(spec, tmp_path)
    assert res.resumed_from_step == 6 and "truncated" in res.refused_checkpoints[0]
    assert res.metrics == whole.metrics
    assert train_losses(run_dir(spec, tmp_path) / "metrics.jsonl") == train_losses(
        run_dir(spec, tmp_path, out="whole") / "metrics.jsonl"
    )


def test_streamed_safetensors_load_with_the_safetensors_library(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from gpucampaign.checkpoint.tensorfiles import safetensors_buffers, write_hashed

    g = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 2, generator=g).half(),
        "i64": torch.arange(5),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
        "u8": torch.arange(3, dtype=torch.uint8),
        "strided": torch.randn(4, 6, generator=g).t(),  # not contiguous
    }
    digest, size = write_hashed(
        tmp_path / "m.safetensors", safetensors_buffers(tensors, metadata={"k": "v"})
    )
    data = (tmp_path / "m.safetensors").read_bytes()
    assert size == len(data) and digest == hashlib.sha256(data).hexdigest()
    digest, _ = write_hashed(
        tmp_path / "m.safetensors", safetensors_buffers(tensors, metadata={"k": "v"}), kind="crc32c"
    )
    assert digest == _crc32c(data)
    loaded = load_file(tmp_path / "m.safetensors")
    assert loaded.keys() == tensors.keys()
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k
    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        assert f.metadata() == {"k": "v"}


def test_read_hashed_and_the_zero_copy_safetensors_reader(tmp_path):
    from safetensors.torch import save

    from gpucampaign.checkpoint.tensorfiles import load_safetensors_buffer
    from gpucampaign.core.files import map_checked, read_hashed

    g = torch.Generator().manual_seed(0)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "i64": torch.arange(5),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
    }
    path = tmp_path / "m.safetensors"
    path.write_bytes(save(tensors, metadata={"k": "v"}))  # written by the library itself
    buf, digest = read_hashed(path)
    assert bytes(buf) == path.read_bytes() and digest == hashlib.sha256(buf).hexdigest()
    loaded = load_safetensors_buffer(buf)
    assert loaded.keys() == tensors.keys()
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
        assert torch.equal(loaded[k], v), k
    for bad in (buf[:4], buf[:-3], bytearray(b"\xff" * 8) + buf[8:]):
        with pytest.raises(ValueError):
            load_safetensors_buffer(bytearray(bad))
    mapped, crc, _ = map_checked(path, kind="crc32c")
    assert crc == _crc32c(path.read_bytes())
    assert all(torch.equal(t, tensors[k]) for k, t in load_safetensors_buffer(mapped).items())


def test_background_saves_snapshot_and_one_in_flight(tmp_path):
    import threading

    from gpucampaign.checkpoint.state import BackgroundSaves, snapshot

    model = torch.nn.Linear(3, 2)
    state = {"params": model.state_dict(), "nested": [torch.ones(2), ("x", 3)]}
    snap = snapshot(state)
    with torch.no_grad():
        model.weight.add_(1.0)
        state["nested"][0].add_(1.0)
    assert not torch.equal(snap["params"]["weight"], model.weight)  # a copy, not a view
    assert torch.equal(snap["nested"][0], torch.ones(2)) and snap["nested"][1] == ("x", 3)

    saves, release = BackgroundSaves(), threading.Event()
    saves.submit(lambda: release.wait(5) and "saved")
    assert saves.in_flight
    with pytest.raises(AssertionError, match="in flight"):
        saves.submit(lambda: "second")  # never two in flight
    release.set()
    assert saves.wait() == "saved" and not saves.in_flight and saves.wait() is None
    saves.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        saves.wait()  # a failed save surfaces in the loop
    saves.close()


def test_the_saves_thread_is_started_before_the_first_save() -> None:
    """The thread that writes the saves runs (idle) once ``BackgroundSaves`` is made, before
    the training's first save: started by that save, it would run it at once and hold the
    interpreter while the loop waits (5 ms, the switch interval; main started it there)."""
    import threading

    from gpucampaign.checkpoint.state import BackgroundSaves

    before = {t.ident for t in threading.enumerate()}
    saves = BackgroundSaves()
    try:
        started = [t for t in threading.enumerate() if t.ident not in before]
        assert [t.name.startswith("checkpoint") for t in started] == [True]
        assert not saves.in_flight
    finally:
        saves.close()


def test_a_run_logs_the_stall_and_the_write_of_each_save(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, checkpoint={"every_steps": 7})
    res = run(spec, tmp_path)
    rows = [json.loads(line) for line in (run_dir(spec, tmp_path) / "metrics.jsonl").open()]
    saves = [r for r in rows if r["kind"] == "checkpoint"]
    assert [r["step"] for r in saves] == [7, 14, 20] and res.n_checkpoints == 3
    assert all(r["stall_s"] > 0 and r["write_s"] > 0 for r in saves)
    assert res.timings["stall_s"] == [r["stall_s"] for r in saves]


# --- headers checked for bounds before a checkpoint counts --------------------------------------
def _safetensors(header: dict, data: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    return len(head).to_bytes(8, "little") + head + data


def _plant_model(m: CheckpointManager, root: Path, step: int, data: bytes) -> None:
    """Replace the model file of a committed checkpoint and re-sign its meta and ``LATEST``:
    hashes and sizes all match, so only the header's own checks can refuse it."""
    _file(root, step, WEIGHTS_FILE).write_bytes(data)
    meta = json.loads(_file(root, step, CHECKPOINT_META).read_text())
    meta["files"][WEIGHTS_FILE] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    _file(root, step, CHECKPOINT_META).write_bytes(meta_bytes)
    ptr = {
        "step": step,
        "dir": checkpoint_step_dir(step),
        "meta_sha256": hashlib.sha256(meta_bytes),
    }
    ptr["meta_sha256"] = ptr["meta_sha256"].hexdigest()
    m.store.write_bytes(f"{RUN}/{CHECKPOINT_LATEST}", data=json.dumps(ptr).encode())


BAD_HEADERS = {
    "offsets beyond any number": (
        _safetensors({"w": {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 1e999]}}),
        "data_offsets",
    ),
    "offsets as floats": (
        _safetensors({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}}, b"\0" * 4),
        "data_offsets",
    ),
    "a 60 MB header and no tensor": (
        _safetensors({"__metadata__": {"pad": "x" * 60_000_000}}),
        "over the limit",
    ),
    "no tensor": (_safetensors({"__metadata__": {"format": "x"}}), "no tensor"),
    "a negative size": (
        _safetensors({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "shape",
    ),
    "another model's tensors": (
        _safetensors({"v": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "lacks tensors ['b', 'w']",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_a_checkpoint_with_a_bad_header_is_refused_and_the_previous_one_used(tmp_path, case):
    data, reason = BAD_HEADERS[case]
    m = _manager(tmp_path)
    for step in (2, 4):
        model, state = _state(step)
        m.save(step, model_state=model, train_state=state)
    m.expect_tensors = {k: tuple(v.shape) for k, v in _state(0)[0].items()}
    _plant_model(m, tmp_path, 4, data)
    ck, refused = m.load_latest()
    assert ck is not None and ck.step == 2
    assert len(refused) == 1 and WEIGHTS_FILE in refused[0] and reason in refused[0], refused


@pytest.mark.parametrize("fail_at", [1, 2, 3, 5, 8])
def test_a_full_disk_in_the_state_file_is_the_write_error(tmp_path, monkeypatch, fail_at):
    """Whichever write of ``torch.save`` hits the full disk, the error is that write's OSError
    (the manager names it as a StorageError), not the zip writer's own RuntimeError."""
    import errno

    from gpucampaign.checkpoint import tensorfiles

    calls = {"n": 0}
    write_all = tensorfiles._write_all

    def write_some(f, chunk):
        calls["n"] += 1
        if calls["n"] >= fail_at:
            f.write(chunk[: len(chunk) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        write_all(f, chunk)

    monkeypatch.setattr(tensorfiles, "_write_all", write_some)
    state = {"a": torch.arange(1000.0), "b": {"step": 3}, "c": torch.ones(50, 50)}
    with pytest.raises(OSError, match="No space left on device"):
        tensorfiles.save_state(tmp_path / "state.pt", state, kind="crc32c")
    assert calls["n"] >= fail_at


@pytest.mark.skipif(not Path("/proc/thread-self/io").exists(), reason="Linux's per-thread I/O")
def test_the_state_file_goes_out_in_a_few_writes_not_one_per_record(tmp_path):
    """``torch.save`` hands over each record's header and name apart: unbuffered, an Adam
    state of the demo's MLP took 99 write calls (each one lets the training thread's GIL go
    and back while the save runs beside its steps); buffered, one. The file is the same."""
    from gpucampaign.checkpoint import tensorfiles

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "step": 5}

    def writes() -> int:
        text = Path("/proc/thread-self/io").read_text(encoding="utf-8")
        return int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("syscw")))

    before = writes()
    _, size = tensorfiles.save_state(tmp_path / "state.pt", state, kind="crc32c")
    assert writes() - before <= 3
    assert size == (tmp_path / "state.pt").stat().st_size
    assert tensorfiles.serialize_state(state).tobytes() == (tmp_path / "state.pt").read_bytes()
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded["step"] == 5 and loaded["optimizer"]["state"][0]["step"] == 1
