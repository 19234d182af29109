"""A revived host never writes over a campaign another host sealed (issue 45), on the real stack.

The session's campaign (``finished_campaign``) was closed for good and mirrored to the stack's
bucket. Host A comes back with the same campaign's output folder as it was before that close
(its runs cut before their end, no manifest), and ``campaign/main`` is run there again, as a
deployment run landing on a revived host would be. It is refused before anything is written:
every object under the campaign's prefix keeps its sha256, host A's folder keeps its bytes, the
refusal is one paragraph naming the sealed manifest and the retrieve, and ``campaign retrieve``
brings back the sealed folder (its manifest's sha256 the close printed).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, S3_BUCKET, run_deployment, s3_client, worker_log

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

#: What host A's folder did not have yet: the close's files (it stopped mid-training).
CLOSED_FILES = ("manifest.json", "report.md", "report.json", "report.html", "RELOAD.md")


def bucket_objects(stack: dict[str, Any], prefix: str) -> dict[str, str]:
    """The sha256 of every object under ``prefix/`` of the stack's bucket, by key."""
    client, found = s3_client(stack), {}
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=S3_BUCKET, Prefix=f"{prefix}/"
    ):
        for obj in page.get("Contents", []):
            body = client.get_object(Bucket=S3_BUCKET, Key=obj["Key"])["Body"].read()
            found[obj["Key"]] = hashlib.sha256(body).hexdigest()
    return found


def folder_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, by its relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_revived_host_with_an_old_folder_leaves_the_sealed_campaign_as_it_is(
    stack, finished_campaign, tmp_path, faults
):
    assert finished_campaign["state"].get("type") == "COMPLETED", finished_campaign["state"]
    url = f"s3://{S3_BUCKET}/{finished_campaign['prefix']}"
    sealed = hashlib.sha256((finished_campaign["out"] / "manifest.json").read_bytes()).hexdigest()
    old = tmp_path / "host-a" / "out"
    shutil.copytree(finished_campaign["out"], old)
    for name in CLOSED_FILES:
        (old / name).unlink(missing_ok=True)
    for result in old.glob("runs/*/result.json"):
        result.unlink()
    in_bucket, in_folder = bucket_objects(stack, finished_campaign["prefix"]), folder_bytes(old)
    assert f"{finished_campaign['prefix']}/manifest.json" in in_bucket

    faults.add("faults_injected")
    flow_run_id, state = run_deployment(
        stack, "campaign/main", spec=str(finished_campaign["spec"]), out=str(old)
    )
    # Nothing moved: not one object of the campaign's prefix, not one byte of host A's folder.
    after = bucket_objects(stack, finished_campaign["prefix"])
    moved = sorted(k for k in after.keys() | in_bucket.keys() if after.get(k) != in_bucket.get(k))
    faults.add("sealed_objects_rewritten", sum(k in in_bucket for k in moved))
    assert moved == [], f"{flow_run_id} {state.get('type')}: {len(moved)} objects moved: {moved}"
    assert folder_bytes(old) == in_folder
    said = state.get("message") or ""
    assert state.get("type") == "FAILED", f"{flow_run_id}: {state}\n{worker_log(stack)}"
    assert "closed for good" in said and sealed in said and "it has no manifest.json" in said
    assert f"campaign retrieve {url} --to NEW_FOLDER" in said and "Traceback" not in said
    faults.add("stale_hosts_refused")

    back = tmp_path / "retrieved"
    done = subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", "retrieve", url, "--to", str(back)],
        cwd=ROOT,
        env=stack["env"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert hashlib.sha256((back / "manifest.json").read_bytes()).hexdigest() == sealed
    assert (back / "report.md").read_bytes() == (
        finished_campaign["out"] / "report.md"
    ).read_bytes()
    faults.add("faults_survived")
