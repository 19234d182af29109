"""A worker-like process killed with SIGKILL mid-training, restarted on a fresh output folder
on another "host": it resumes from the S3 checkpoint and ends with exactly the parameters of
an uninterrupted run. Real SeaweedFS, real processes; no fakes on this path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from gpucampaign.checkpoint import LATEST_FILE
from gpucampaign.spec import load_spec
from gpucampaign.training import MODEL_DIR
from infra.s3server import start_server
from tests._engine import digits_file, make_spec  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
WORKER = """
import json, sys
from pathlib import Path
from gpucampaign.corpus import load_spec_corpus
from gpucampaign.spec import load_spec
from gpucampaign.storage import open_store
from gpucampaign.training import train_run
spec_file, out = Path(sys.argv[1]), Path(sys.argv[2])
spec = load_spec(spec_file)
store = open_store(spec.storage.url, out_dir=out)
result = train_run(spec, run="control", corpus=load_spec_corpus(spec, base_dir=spec_file.parent),
                   store=store, out_dir=out / "runs" / spec.run_id("control"))
assert store.drain(timeout_s=60) == [], "spool not drained"
print(json.dumps({"resumed_from_step": result.resumed_from_step, "steps": result.steps_done}))
"""


def _campaign(tmp_path: Path, digits, *, prefix: str) -> Path:
    spec = make_spec(
        tmp_path,
        digits,
        control={"epochs": 12},
        checkpoint={"every_steps": 10},
        storage={"url": f"s3://gpucampaign/{prefix}"},
    )
    path = tmp_path / f"{prefix}.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    return path


def _worker(spec: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(spec), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _params(out: Path, spec: Path) -> dict:
    rid = load_spec(spec).run_id("control")
    return load_file(str(out / "runs" / rid / MODEL_DIR / "model.safetensors"))


def test_sigkilled_worker_resumes_on_a_fresh_folder_from_s3(tmp_path, digits_file):  # noqa: F811
    srv = start_server(tmp_path / "s3")
    env = {**os.environ, **srv.env(), "PYTHONPATH": str(ROOT / "src")}
    try:
        ref_spec = _campaign(tmp_path, digits_file, prefix="reference")
        ref = _worker(ref_spec, tmp_path / "ref-out", env)
        killed_spec = _campaign(tmp_path, digits_file, prefix="killed")
        rid = load_spec(killed_spec).run_id("control")
        first = _worker(killed_spec, tmp_path / "host-a", env)
        client, key = srv.client(), f"killed/{rid}/{LATEST_FILE}"
        deadline = time.monotonic() + 300
        step = 0
        while step < 30 and time.monotonic() < deadline and first.poll() is None:
            try:
                step = json.loads(client.get_object(Bucket=srv.bucket, Key=key)["Body"].read())[
                    "step"
                ]
            except client.exceptions.NoSuchKey:
                pass
            time.sleep(0.05)
        assert first.poll() is None, "the worker ended before it could be killed"
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        assert first.returncode == -signal.SIGKILL and step >= 30

        second = _worker(killed_spec, tmp_path / "host-b", env)  # a fresh output folder
        out, err = second.communicate(timeout=400)
        assert second.returncode == 0, err[-2000:]
        done = json.loads(out.strip().splitlines()[-1])
        assert done["resumed_from_step"] and done["resumed_from_step"] >= step
        ref_out, ref_err = ref.communicate(timeout=400)
        assert ref.returncode == 0, ref_err[-2000:]
        a, b = _params(tmp_path / "ref-out", ref_spec), _params(tmp_path / "host-b", killed_spec)
        assert a.keys() == b.keys()
        assert all((a[k] == b[k]).all() for k in a)  # atol = 0
    finally:
        srv.stop()
