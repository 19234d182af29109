"""The scheduled check says what it found: the latest kept checkpoint, what is wrong with it,
and the older checkpoint a resume would still use; it never passes on an older one."""

from __future__ import annotations

import pytest

from gpucampaign.core.files import FAST_CHECKSUM, checksum_bytes
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.restartcheck.scheduled import check_latest_checkpoint, verify_checkpoint_resume
from gpucampaign.restartcheck.target import RestartTarget
from gpucampaign.storage import LocalStore
from tests.helpers import digits_file, make_spec, run, run_dir  # noqa: F401


@pytest.fixture
def finished(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, checkpoint={"keep": 3})
    res = run(spec, tmp_path, checkpoint_every=7)  # saves at 7, 14, 20: keeps all three
    assert res.completed
    return spec


def _target(spec, tmp_path):
    return RestartTarget(
        spec=spec,
        run=spec.resolve_run("control"),
        corpus_path=tmp_path / "data" / "digits.csv",
        store=LocalStore(tmp_path / "out" / "checkpoints"),
        run_dir=run_dir(spec, tmp_path),
        workdir=tmp_path / "work",
    )


def _latest(spec, tmp_path):
    return tmp_path / "out" / "checkpoints" / spec.resolve_run("control").run_id / "step-000000020"


def test_flipped_bytes_in_the_latest_fail_the_check_with_both_hashes(tmp_path, finished):
    target = _latest(finished, tmp_path) / "model.safetensors"
    data = bytearray(target.read_bytes())
    before = checksum_bytes(bytes(data), kind=FAST_CHECKSUM)
    for i in range(len(data) - 64, len(data)):
        data[i] ^= 0xFF
    target.write_bytes(bytes(data))
    after = checksum_bytes(bytes(data), kind=FAST_CHECKSUM)

    found = check_latest_checkpoint(_target(finished, tmp_path))
    assert not found.ok and found.report is None
    assert found.expected_step == 20 and found.resumes_from == 14
    assert found.problem is not None and found.problem.kind == "checksum mismatch"
    assert found.problem.obj.endswith("step-000000020/model.safetensors")
    assert (found.problem.expected_sha256, found.problem.actual_sha256) == (before, after)
    line = found.summary()
    assert before in line and after in line and "step 14 would still resume" in line
    row = found.to_dict()
    assert row["ok"] is False and row["problem"]["actual_sha256"] == after

    with pytest.raises(NoUsableRestart, match=after) as exc:  # never a fallback to step 14
        verify_checkpoint_resume(_target(finished, tmp_path))
    assert exc.value.step == 20


def test_the_latest_state_deleted_fails_naming_the_missing_object(tmp_path, finished):
    (_latest(finished, tmp_path) / "state.pt").unlink()
    found = check_latest_checkpoint(_target(finished, tmp_path))
    assert not found.ok and found.expected_step == 20 and found.resumes_from == 14
    assert found.problem is not None and found.problem.kind == "missing object"
    assert found.problem.obj == f"{finished.resolve_run('control').run_id}/step-000000020/state.pt"
    assert "missing object" in found.summary() and "state.pt" in found.summary()


def test_the_resume_point_before_a_final_latest_is_checked_too(tmp_path, finished):
    # The final step trains nothing: the check resumes step 14, which must load as well.
    (_latest(finished, tmp_path).parent / "step-000000014" / "state.pt").unlink()
    found = check_latest_checkpoint(_target(finished, tmp_path))
    assert not found.ok and found.problem is not None
    assert found.problem.kind == "missing object" and found.problem.step == 14
    assert found.expected_step == 20 and found.resumes_from == 7


def test_the_flow_report_names_the_problem(tmp_path, finished):
    pytest.importorskip("prefect")
    from gpucampaign_prefect.flows.restart_check import restart_markdown

    (_latest(finished, tmp_path) / "state.pt").unlink()
    row = check_latest_checkpoint(_target(finished, tmp_path)).to_dict()
    md = restart_markdown("demo", tmp_path, [row])
    assert "FAILED" in md and "missing object" in md and "step-000000020/state.pt" in md
    assert "| step 20 |" in md and "| step 14 |" in md
