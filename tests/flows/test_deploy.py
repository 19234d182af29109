"""`campaign deploy`: the deployments of deployments/prefect.yaml, registered from the user's
own project folder with the installed entrypoints, on the server of PREFECT_API_URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.cli.scaffold import init_campaign

pytestmark = [pytest.mark.slow]


def _campaign(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, " ".join(result.output.split())


def test_deploy_registers_both_deployments_for_the_project_folder(
    prefect_harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "my project"
    init_campaign(project / "mine")
    monkeypatch.chdir(project)
    code, said = _campaign("deploy", "mine/campaign.yaml", "--out", "runs/first")
    assert code == 0, said
    assert "deployed campaign/main" in said and "deployed restart-verification/scheduled" in said
    # Again, with another output folder: the deployments are replaced, not doubled.
    code, said = _campaign("deploy", "mine/campaign.yaml")
    assert code == 0, said
    with get_client(sync_client=True) as client:
        main = client.read_deployment_by_name("campaign/main")
        scheduled = client.read_deployment_by_name("restart-verification/scheduled")
        pool = client.read_work_pool("gpucampaign")
    root = str(project.resolve())
    assert main.entrypoint == "gpucampaign_prefect.flows.campaign:campaign"
    assert scheduled.entrypoint == "gpucampaign_prefect.flows.restart_check:restart_verification"
    assert main.parameters == {"spec": "mine/campaign.yaml", "out": "out/digits"}
    # Every run of it, a relaunch waiting for a worker too, is tagged like its campaign.
    assert main.tags == ["gpucampaign", "campaign:digits"]
    assert scheduled.tags == ["gpucampaign"]
    assert scheduled.parameters == {"out": "out/digits"}
    for dep in (main, scheduled):
        assert dep.work_pool_name == "gpucampaign" and "gpucampaign" in dep.tags
        assert dep.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": root}}
        ]
        assert dep.job_variables["working_dir"] == root
        assert dep.job_variables["env"] == {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "60"}
    assert "spec" in main.parameter_openapi_schema["properties"]
    assert [s.schedule.cron for s in scheduled.schedules] == ["0 */6 * * *"]
    assert main.schedules == []
    assert pool.type == "process"
    assert "working_dir" in pool.base_job_template["variables"]["properties"]


def test_a_second_project_gets_deployments_of_its_own_and_never_replaces_the_first(
    prefect_harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for project in (one, two):
        init_campaign(project / "mine")
    monkeypatch.chdir(one)  # the session's server may hold another test's: moved here
    code, said = _campaign("deploy", "mine/campaign.yaml", "--out", "out/one", "--replace")
    assert code == 0, said

    def folders() -> dict[str, str]:
        with get_client(sync_client=True) as client:
            found = {}
            for name in ("campaign/main", "restart-verification/scheduled"):
                found[name] = client.read_deployment_by_name(name).job_variables["working_dir"]
            return found

    first = folders()
    assert set(first.values()) == {str(one.resolve())}
    # From the second project, the same names: refused, nothing registered, one paragraph.
    monkeypatch.chdir(two)
    code, said = _campaign("deploy", "mine/campaign.yaml", "--out", "out/two")
    assert code == 2 and "Traceback" not in said, said
    assert f"campaign/main (from '{one.resolve()}')" in said and "--name NAME" in said
    assert "Nothing was registered" in said and "--replace" in said
    assert folders() == first
    code, said = _campaign("deploy", "mine/campaign.yaml", "--name", "no/slash")
    assert code == 2 and "option '--name'" in said, said
    # Its own names, beside the first project's.
    code, said = _campaign("deploy", "mine/campaign.yaml", "--out", "out/two", "--name", "two")
    assert code == 0, said
    assert "deployed campaign/two" in said and "deployed restart-verification/two" in said
    assert "prefect deployment run campaign/two" in said
    with get_client(sync_client=True) as client:
        mine = client.read_deployment_by_name("campaign/two")
        check = client.read_deployment_by_name("restart-verification/two")
    assert mine.job_variables["working_dir"] == str(two.resolve())
    assert mine.parameters == {"spec": "mine/campaign.yaml", "out": "out/two"}
    assert check.parameters == {"out": "out/two"}
    assert folders() == first
    # Again from its own folder: replaced in place; --replace moves the first project's.
    code, said = _campaign("deploy", "mine/campaign.yaml", "--out", "out/2", "--name", "two")
    assert code == 0, said
    code, said = _campaign("deploy", "mine/campaign.yaml", "--replace")
    assert code == 0, said
    assert set(folders().values()) == {str(two.resolve())}


def test_deploy_without_a_server_says_how_to_point_at_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    init_campaign(tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        code, said = _campaign("deploy", "mine/campaign.yaml")
    assert code == 2 and "PREFECT_API_URL is not set" in said and "Traceback" not in said


@pytest.mark.process
@pytest.mark.timeout(900)
def test_a_deployed_campaign_runs_in_the_project_folder(
    prefect_harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`campaign deploy` from the project folder, then a worker started elsewhere runs
    campaign/main: the flow-run process imports the installed entrypoint and stands in the
    project folder, so the spec and the output folder resolve there."""
    import os
    import subprocess
    import sys
    import uuid

    import yaml
    from prefect.deployments import run_deployment
    from prefect.settings import get_current_settings

    project = tmp_path / "proj"
    spec = init_campaign(project / "mine")
    data = yaml.safe_load(spec.read_text())
    data["control"] = {**data["control"], "epochs": 2}
    data["pilot"] = {"steps": 5}
    data["gpu_lock"] = {"name": f"gpu-{uuid.uuid4().hex[:8]}", "timeout_s": 600, "lease_s": 60}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    monkeypatch.chdir(project)
    code, said = _campaign(
        "deploy", "mine/campaign.yaml", "--out", "out/mine", "--pool", pool, "--replace"
    )
    assert code == 0, said
    flow_run = run_deployment("campaign/main", timeout=0)
    env = {**os.environ, "PREFECT_API_URL": str(get_current_settings().api.url)}
    worker = subprocess.run(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--run-once"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
    assert state is not None and state.is_completed(), (state, worker.stdout[-4000:])
    assert (project / "out" / "mine" / "manifest.json").is_file()
    assert not (tmp_path / "out").exists()
