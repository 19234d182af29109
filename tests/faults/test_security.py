"""Security: pickle payloads are refused, names and paths stay inside their folder, links
planted in an output folder are named rather than followed, and secrets never reach a file."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucampaign.checkpoint.manager import CheckpointManager
from gpucampaign.config import SpecError, load_spec, resolve_inside
from gpucampaign.storage import LocalStore, StorageError
from tests.faults.conftest import CANARIES
from tests.helpers import reseal

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "campaign.yaml"


class Payload:
    """Unpickling this creates the file ``marker``: the test that it is refused is a real one."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _state(step: int) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(step)
    model = {"w": torch.randn(4, 3, generator=g)}
    state = {
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "scheduler": None,
        "scaler": {},
        "rng": {"python": None, "numpy": None, "torch": torch.get_rng_state(), "cuda": []},
        "cursor": {"epoch": 0, "batch_in_epoch": step, "epoch_generator_state": g.get_state()},
        "counters": {"global_step": step},
    }
    return model, state


def _plant_state(manager: CheckpointManager, step: int, data: bytes) -> None:
    """Replace ``state.pt`` of a committed checkpoint and re-sign its meta and LATEST, so that
    only the unpickling itself can refuse it (hashes and sizes all match)."""
    folder = manager.store.local_path(f"{manager.run_id}/step-{step:09d}")
    (folder / "state.pt").write_bytes(data)
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"]["state.pt"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    (folder / "meta.json").write_bytes(meta_bytes)
    pointer = {
        "step": step,
        "dir": folder.name,
        "meta_sha256": hashlib.sha256(meta_bytes).hexdigest(),
    }
    manager.store.write_bytes(f"{manager.run_id}/LATEST", data=json.dumps(pointer).encode())


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("form", ["torch-zip", "raw-pickle"])
def test_a_pickle_payload_in_a_state_file_is_refused(tmp_path, faults, form):
    marker = tmp_path / "pwned"
    # The payload is real: loading it without weights_only creates the marker.
    probe = io.BytesIO()
    torch.save({"x": Payload(tmp_path / "probe")}, probe)
    torch.load(io.BytesIO(probe.getvalue()), weights_only=False)
    assert (tmp_path / "probe").exists()

    manager = CheckpointManager(
        LocalStore(tmp_path / "store"), run_id="control-0123456789", config_sha256="ab" * 32
    )
    model, state = _state(4)
    manager.save(4, model_state=model, train_state=state)
    evil = dict(state, optimizer=Payload(marker))
    if form == "torch-zip":
        buf = io.BytesIO()
        torch.save(evil, buf)
        data = buf.getvalue()
    else:
        import pickle

        data = pickle.dumps(evil)
    _plant_state(manager, 4, data)
    faults.add("faults_injected")
    ck, refused = manager.load_latest()
    assert ck is None and len(refused) == 1
    assert "state.pt refused by torch.load(weights_only=True)" in refused[0], refused
    assert not marker.exists()
    faults.add("faults_survived")


# --- names and paths stay inside their folder -----------------------------------------------
KEY_TRICKS = st.sampled_from(
    [
        "../x",
        "../../etc/passwd",
        "/etc/passwd",
        "a/../../x",
        "a/./b",
        "a//b",
        "",
        ".",
        "..",
        "a\x00b",
        "a\\..\\..\\x",
        "~/x",
        "run/../../x",
    ]
) | st.lists(st.sampled_from(["..", ".", "a", "", "~", "/", "\\"]), min_size=1, max_size=5).map(
    "/".join
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=KEY_TRICKS)
def test_a_store_key_never_leaves_the_store(tmp_path, faults, key):
    root = tmp_path / "inside" / "store"
    root.mkdir(parents=True, exist_ok=True)
    store = LocalStore(root)
    faults.add("fuzzed_inputs")
    for op in (
        lambda: store.write_bytes(key, data=b"x"),
        lambda: store.read_bytes(key),
        lambda: store.put_file(key, src=EXAMPLE),
        lambda: store.delete(key),
    ):
        try:
            op()
        except StorageError:
            pass
    outside = [
        p for p in tmp_path.rglob("*") if root not in p.parents and p != root and p.is_file()
    ]
    assert outside == []
    for p in root.rglob("*"):
        assert p.resolve().is_relative_to(root.resolve())


def test_a_link_planted_in_the_store_is_not_followed(tmp_path, faults):
    outside = tmp_path / "outside"
    outside.mkdir()
    store = LocalStore(tmp_path / "store")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "control-0123456789").symlink_to(outside, target_is_directory=True)
    manager = CheckpointManager(store, run_id="control-0123456789", config_sha256="ab" * 32)
    model, state = _state(2)
    faults.add("faults_injected")
    with pytest.raises(StorageError, match="outside the store root"):
        manager.save(2, model_state=model, train_state=state)
    with pytest.raises(StorageError):
        store.read_bytes("control-0123456789/LATEST")
    assert list(outside.iterdir()) == []
    faults.add("faults_survived")


def test_a_run_id_that_climbs_is_refused_by_the_store(tmp_path):
    manager = CheckpointManager(
        LocalStore(tmp_path / "store"), run_id="../escape", config_sha256="ab" * 32
    )
    model, state = _state(1)
    with pytest.raises(StorageError):
        manager.save(1, model_state=model, train_state=state)
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("value", ["../data.csv", "/etc/passwd", "data/../../x.csv", "C:\\x.csv"])
@pytest.mark.parametrize("field", ["corpus.path", "catalog"])
def test_spec_paths_must_stay_in_the_spec_folder(tmp_path, field, value):
    text = EXAMPLE.read_text(encoding="utf-8")
    if field == "corpus.path":
        text = text.replace("path: data/digits.csv", f"path: '{value}'")
    else:
        text += f"\ncatalog: '{value}'\n"
    (tmp_path / "campaign.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match=field.split(".")[0]):
        load_spec(tmp_path / "campaign.yaml")


def test_a_link_in_the_spec_folder_does_not_reach_outside(tmp_path):
    (tmp_path / "secret.csv").write_text("id,label\n")
    spec_dir = tmp_path / "campaign"
    spec_dir.mkdir()
    (spec_dir / "data.csv").symlink_to(tmp_path / "secret.csv")
    with pytest.raises(SpecError, match="outside"):
        resolve_inside(spec_dir, "data.csv", field="corpus.path")


# --- a real campaign: links planted in its folder, secrets in its environment ------------------
@pytest.fixture(scope="module")
def campaign_out(secret_campaign):
    """``campaign run`` of the digits example with canary secrets in the environment (the
    session's ``secret_campaign``, which test_credentials searches too)."""
    return secret_campaign


@pytest.mark.slow
@pytest.mark.process
def test_no_secret_reaches_the_output_folder_or_the_log(campaign_out, faults):
    """The output folder, the command's output and Prefect's own database (its logs,
    artifacts and run parameters) hold none of the canaries."""
    out, home, log = campaign_out
    leaks = []
    for root in (out, home):
        for p in sorted(root.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                leaks += [f"{p}: {k}" for k, v in CANARIES.items() if v.encode() in data]
    leaks += [f"log: {k}" for k, v in CANARIES.items() if v in log]
    faults.add("secrets_leaked", len(leaks))
    assert leaks == []
    assert (out / "manifest.json").is_file() and len(list(out.rglob("*"))) > 10
    assert any(p.suffix == ".db" for p in home.rglob("*")), "Prefect's database was not scanned"


@pytest.mark.slow
@pytest.mark.process
def test_the_close_prints_the_manifests_sha256_that_verify_expects(campaign_out, tmp_path):
    """`campaign run` ends with the sha256 of the manifest it sealed; `verify --expect` with it
    passes, and on a copy whose manifest was rewritten it fails naming both."""
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    out, _, log = campaign_out
    sha = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    assert f"manifest.json sha256: {sha}" in " ".join(log.split())
    got = CliRunner().invoke(app, ["verify", str(out), "--expect", sha])
    assert got.exit_code == 0 and "as expected (--expect)" in got.output, got.output
    copy = Path(shutil.copytree(out, tmp_path / "out", symlinks=True))
    (copy / "report.md").write_text("# rewritten\n")
    reseal(copy)
    got = CliRunner().invoke(app, ["verify", str(copy), "--expect", sha])
    text = " ".join(got.output.split())
    assert got.exit_code == 4 and "manifest_not_anchored" in text and sha in text, text


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("kind", ["file", "folder"])
def test_verify_names_a_planted_link_and_does_not_follow_it(campaign_out, tmp_path, faults, kind):
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    out = tmp_path / "out"
    shutil.copytree(campaign_out[0], out, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours")
    link = out / "runs" / "planted"
    link.symlink_to(outside / "secret.txt" if kind == "file" else outside)
    faults.add("faults_injected")
    result = CliRunner().invoke(app, ["verify", str(out), "--no-reload", "--json"])
    assert result.exit_code == 4, result.output
    report = json.loads(result.output)
    named = [p for p in report["problems"] if p["path"] == "runs/planted"]
    assert named and named[0]["code"] == "escaping_path", report["problems"]
    assert (outside / "secret.txt").read_text() == "not yours" and len(list(outside.iterdir())) == 1
    faults.add("faults_survived")


@pytest.mark.parametrize("rid", ["../../victim", "/abs/victim", "..", "a/../../victim"])
def test_a_manifest_run_id_or_file_that_climbs_is_named_not_read(tmp_path, faults, rid):
    from gpucampaign.verify.checks import verify_output

    victim = tmp_path / "victim"
    (victim / "model").mkdir(parents=True)
    (victim / "predictions.csv").write_text("id,pred\n1,0\n")
    out = tmp_path / "a" / "out"
    out.mkdir(parents=True)
    (out / "spec.yaml").write_bytes(EXAMPLE.read_bytes())
    manifest = {
        "files": [{"path": "../../victim/predictions.csv", "size": 1, "sha256": "0" * 64}],
        "runs": {rid: {"run": "control", "status": "completed"}},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    faults.add("faults_injected")
    report = verify_output(out, reload=True, timeout_s=60)
    escaping = [p.detail for p in report.problems if p.code == "escaping_path"]
    assert any(rid in d for d in escaping) and any("victim/predictions.csv" in d for d in escaping)
    assert report.reloaded_runs == [] and not report.verified
    assert sorted(p.name for p in victim.rglob("*")) == ["model", "predictions.csv"]
    faults.add("faults_survived")


# --- one writer per output folder -------------------------------------------------------------
_HOLD = """
import sys, time
from gpucampaign.folder.lock import writer_lock
with writer_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _hold_lock(folder: Path) -> subprocess.Popen:
    """Another process that holds the writer lock of ``folder`` until killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(folder)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


_OUT = {"capture_output": True, "text": True, "check": True}


def _closed_copy(closed: dict, tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the closed campaign: ``(spec file, output folder)``."""
    src = shutil.copytree(closed["out"].parent / "src", tmp_path / "src")
    out = shutil.copytree(closed["out"], tmp_path / "out")
    return Path(src) / "campaign.yaml", Path(out)


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.process  # the holder is a new process that imports torch
def test_a_second_writer_is_refused_naming_the_holder(closed, tmp_path, faults):
    import socket

    from typer.testing import CliRunner

    from gpucampaign.cli import app
    from gpucampaign.folder.lock import FolderLocked, writer_lock

    spec, _ = _closed_copy(closed, tmp_path)
    out = tmp_path / "fresh"
    holder = _hold_lock(out)
    try:
        before = _hashes(out)
        with pytest.raises(FolderLocked, match=f"PID {holder.pid} on host"):
            with writer_lock(out):
                pass
        faults.add("two_writers_refused")
        got = CliRunner().invoke(app, ["run", str(spec), "--out", str(out)])
        said = " ".join(got.output.split())
        assert got.exit_code == 2, got.output
        assert f"PID {holder.pid} on host {socket.gethostname()}" in said and "since" in said
        assert "Traceback" not in got.output and _hashes(out) == before
        faults.add("two_writers_refused")
    finally:
        holder.kill()
        holder.wait()
    with writer_lock(out) as note:  # the holder died: the kernel released its lock
        assert note is None or str(holder.pid) in note


@pytest.mark.process  # the holder is a new process that imports torch
def test_the_deployment_flow_refuses_a_second_writer_before_writing(closed, tmp_path, faults):
    from gpucampaign.folder.lock import FolderLocked
    from gpucampaign_prefect.flows.campaign import campaign

    spec, _ = _closed_copy(closed, tmp_path)
    out = tmp_path / "fresh"
    holder = _hold_lock(out)
    try:
        before = _hashes(out)
        with pytest.raises(FolderLocked, match=f"PID {holder.pid} on host"):
            campaign.fn(spec=str(spec), out=str(out))
        assert _hashes(out) == before
        faults.add("two_writers_refused")
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_of_a_dead_pid_is_taken_over(tmp_path, faults):
    import socket

    from gpucampaign.folder.layout import LOCK_FILE
    from gpucampaign.folder.lock import read_holder, writer_lock

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], **_OUT)
    pid = int(dead.stdout)
    out = tmp_path / "out"
    out.mkdir()
    holder = {"pid": pid, "host": socket.gethostname(), "since": "2026-01-01T00:00:00Z"}
    (out / LOCK_FILE).write_text(json.dumps(holder))
    with writer_lock(out) as note:
        assert note is not None and f"PID {pid}" in note and "gone" in note
        assert read_holder(out)["pid"] == os.getpid()
    faults.add("stale_locks_taken_over")


@pytest.mark.process  # the holder is a new process that imports torch
def test_an_expense_goes_in_while_a_campaign_holds_the_folder(closed, tmp_path):
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    _, out = _closed_copy(closed, tmp_path)
    holder = _hold_lock(out)
    try:
        got = CliRunner().invoke(app, ["expense", str(out), "--usd", "3", "--what", "egress"])
        assert got.exit_code == 0, got.output
    finally:
        holder.kill()
        holder.wait()
    assert "egress" in (out / "ledger.jsonl").read_text()


def test_a_sealed_folder_is_not_rewritten_after_its_corpus_changed(closed, tmp_path, faults):
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    spec, out = _closed_copy(closed, tmp_path)
    before = _hashes(out)
    corpus = spec.parent / "corpus.csv"
    corpus.write_text(corpus.read_text().replace("r001", "r999"))
    faults.add("faults_injected")
    got = CliRunner().invoke(app, ["run", str(spec), "--out", str(out)])
    said = " ".join(got.output.split())
    assert got.exit_code == 2, got.output
    assert "sealed" in said and "corpus 'corpus.csv'" in said and "new --out" in said
    assert "Traceback" not in got.output
    assert _hashes(out) == before
    faults.add("faults_survived")


# --- links are refused, never followed ----------------------------------------------------------
def test_a_folder_corpus_holding_a_link_out_is_refused_at_pin_time(tmp_path, faults):
    from typer.testing import CliRunner

    from gpucampaign.cli import app
    from gpucampaign.close.manifest import reference_corpus

    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0\n")
    corpus = tmp_path / "campaign" / "data"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("0.1 0.2 0.0\n")
    (corpus / "sub" / "passwd").symlink_to(secret)
    got = CliRunner().invoke(app, ["pin", str(corpus)])
    assert got.exit_code == 2 and "Traceback" not in got.output
    assert "sub/passwd" in got.output and "link" in got.output
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SpecError, match="sub/passwd"):
        reference_corpus(out, corpus)
    assert list(out.rglob("*")) == []  # nothing copied
    faults.add("links_refused")


def test_a_recipe_file_that_links_out_of_the_spec_folder_is_refused(tmp_path, faults):
    from gpucampaign.config.recipefile import RecipeError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marker = tmp_path / "imported"
    (elsewhere / "theirs.py").write_text(f"open({str(marker)!r}, 'w')\n")
    spec_dir = tmp_path / "campaign"
    spec_dir.mkdir()
    (spec_dir / "linked_recipe_3f9a.py").symlink_to(elsewhere / "theirs.py")
    text = EXAMPLE.read_text(encoding="utf-8")
    text = text.replace("recipe: mlp", "recipe: linked_recipe_3f9a:R")
    assert "linked_recipe_3f9a" in text
    (spec_dir / "campaign.yaml").write_text(text)
    spec = load_spec(spec_dir / "campaign.yaml")
    with pytest.raises(RecipeError, match="link") as err:
        spec.resolve_run("control")
    assert "linked_recipe_3f9a.py" in str(err.value) and not marker.exists()
    faults.add("links_refused")


def test_report_refuses_a_report_md_that_links_out(closed, tmp_path, faults):
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:canary-passwd-line\n")
    out = Path(shutil.copytree(closed["out"], tmp_path / "out"))
    (out / "report.md").unlink()
    (out / "report.md").symlink_to(secret)
    got = CliRunner().invoke(app, ["report", str(out)])
    assert got.exit_code == 2, got.output
    assert "canary-passwd-line" not in got.output and "Traceback" not in got.output
    assert "report.md" in got.output and "link" in got.output
    faults.add("links_refused")


# --- integrity before trust -------------------------------------------------------------------
def _plant_recipe(out: Path, closed: dict, marker: Path) -> Path:
    """Make the control's model name a recipe whose copy in the folder writes ``marker`` when
    imported; the folder is resealed, so only its integrity decides whether it runs."""
    model = out / "runs" / closed["run_ids"]["control"] / "model"
    (model / "recipe").mkdir(exist_ok=True)
    (model / "recipe" / "planted_recipe.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        "from gpucampaign.builtin.tabular import MLP as Planted\n"
    )
    cfg = json.loads((model / "config.json").read_text())
    cfg["recipe"] = "planted_recipe:Planted"
    cfg["run_config"]["recipe"] = "planted_recipe:Planted"
    # Its sha256 recorded too: a model without one trusts no recipe file at all.
    planted = (model / "recipe" / "planted_recipe.py").read_bytes()
    cfg["recipe_sha256"] = hashlib.sha256(planted).hexdigest()
    (model / "config.json").write_text(json.dumps(cfg, indent=2))
    reseal(out)
    return model


@pytest.mark.process
def test_a_tampered_folder_is_verified_without_running_its_code(
    out: Path, closed: dict, tmp_path: Path, faults
):
    from typer.testing import CliRunner

    from gpucampaign.cli import app
    from gpucampaign.verify.checks import verify_output

    marker = tmp_path / "recipe-imported"
    model = _plant_recipe(out, closed, marker)
    weights = model / "model.safetensors"
    original = weights.read_bytes()
    data = bytearray(original)
    data[-4] ^= 0xFF  # a model file changed after the seal
    weights.write_bytes(bytes(data))
    faults.add("faults_injected")
    got = CliRunner().invoke(app, ["verify", str(out)])
    assert got.exit_code == 4, got.output
    assert "hash_mismatch" in got.output and weights.relative_to(out).as_posix() in got.output
    assert "no recipe copy was imported" in " ".join(got.output.split())
    assert not marker.exists()
    faults.add("tampered_verified_without_code")
    # The payload is real: the folder as sealed runs it when the user trusts its code.
    weights.write_bytes(original)
    verify_output(out)
    assert not marker.exists()  # not by default: its manifest is not anchored
    verify_output(out, trust_folder_code=True)
    assert marker.read_text() == "imported"
    faults.add("faults_survived")


# --- no secret in a message, no terminal escape in a report -------------------------------------
def test_a_password_in_the_endpoint_url_is_never_echoed(tmp_path, faults, monkeypatch):
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    password = "pw-canary-71c3e9"
    text = EXAMPLE.read_text(encoding="utf-8").replace("url: local", "url: s3://bucket/x")
    (tmp_path / "campaign.yaml").write_text(text)
    shutil.copytree(EXAMPLE.parent / "data", tmp_path / "data")  # the preflight reaches the store
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://user:{password}@127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "key")
    got = CliRunner().invoke(app, ["plan", str(tmp_path / "campaign.yaml")])
    assert got.exit_code == 2, got.output
    assert "http://***@127.0.0.1:9" in got.output  # the endpoint is named, its user part not
    faults.add("secrets_leaked", got.output.count(password))
    assert password not in got.output


def test_terminal_escapes_in_a_stop_reason_never_reach_the_report(out, closed, faults):
    from gpucampaign.close.closing import close_folder
    from gpucampaign.folder.records import StopRecord, append_stop

    torch_error = "\x1b[31mRuntimeError\x1b[0m: CUDA error\x07\n\x1b]0;owned\x07at step 3"
    rid = closed["run_ids"]["wide"]
    append_stop(out, StopRecord("stop-aaaaaaaaaaaa", "non_finite_loss", rid, torch_error, 3))
    # A line written by hand (or by an older version), as it came.
    line = {"stop_id": "stop-bbbbbbbbbbbb", "rule": "non_finite_loss", "run_id": rid}
    with open(out / "stops.jsonl", "a") as f:
        f.write(json.dumps({**line, "reason": torch_error}) + "\n")
    faults.add("faults_injected")
    close_folder(
        closed["spec"],
        root=out,
        base_dir=closed["out"].parent / "src",
        campaign_id="closing-test-0001",
        analyses={},
    )
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert "\x1b" not in text and "\x07" not in text, name
    assert "RuntimeError: CUDA error" in (out / "report.md").read_text()
    faults.add("faults_survived")
