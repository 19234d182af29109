"""``campaign run`` and ``campaign restart-check`` say what is starting before anything heavy
loads: their first line is written before torch, Prefect, typer or rich are imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucampaign.cli.starting import starting_line

ROOT = Path(__file__).resolve().parents[2]

# Runs `campaign ARGV...` through the installed entry point's function, and records which
# heavy modules were loaded when the first byte reached stderr.
_TAP = """
import json, sys
heavy = ("torch", "prefect", "typer", "rich")
seen = []

class Tap:
    def __init__(self, f):
        self.f = f
    def write(self, s):
        if not seen:
            seen.append(sorted(m for m in heavy if m in sys.modules))
        return self.f.write(s)
    def __getattr__(self, name):
        return getattr(self.f, name)

sys.stderr = Tap(sys.stderr)
sys.argv = ["campaign", *json.loads(sys.argv[1])]
import gpucampaign.cli
code = 0
try:
    gpucampaign.cli.main()
except SystemExit as exc:
    code = exc.code
from gpucampaign.cli import starting
held = [h.process.pid for h in starting._HELD]  # a held server not taken: the run was refused
out = {"loaded": seen[0] if seen else None, "code": code, "held": held}
sys.stdout.write("\\nTAP " + json.dumps(out))
"""


def _campaign(*argv: str, cwd: Path, home: Path | None = None) -> tuple[str, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    if home is not None:  # its own Prefect home, and no server named
        env["PREFECT_HOME"] = str(home)
        env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", _TAP, json.dumps(list(argv))],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    tap = json.loads(done.stdout.rpartition("TAP ")[2])
    return done.stderr, tap


@pytest.mark.process
def test_campaign_run_says_what_starts_before_heavy_imports(tmp_path):
    spec = tmp_path / "mine.yaml"
    spec.write_text("name: mine\ncontrol: {}\n")
    err, tap = _campaign("run", str(spec), "--decision", "never", cwd=tmp_path)
    first = err.splitlines()[0]
    assert first.startswith(f"starting campaign 'mine' ({spec} -> out/mine): "), err
    assert "Prefect server" in first and "torch" in first
    assert tap["loaded"] == []  # nothing heavy yet when it was written
    assert tap["code"] == 2  # then the command ran: the incomplete spec refused, exit 2
    assert "field 'packages'" in err


@pytest.mark.process
def test_campaign_restart_check_says_what_starts_before_heavy_imports(tmp_path):
    err, tap = _campaign(
        "restart-check", str(tmp_path / "absent.yaml"), "--run", "wider", cwd=tmp_path
    )
    assert err.splitlines()[0] == (
        f"restart check of run 'wider' of {tmp_path / 'absent.yaml'}: loading torch, training "
        "it, interrupting it mid-epoch and resuming it in a new process"
    )
    assert tap["loaded"] == [] and tap["code"] == 2


def test_only_the_slow_commands_say_it_and_never_for_help():
    assert starting_line(["plan", "x.yaml"]) is None
    assert starting_line(["run", "--help"]) is None
    assert starting_line(["run"]) is None
    assert starting_line(["run", "--out=o", "s.yaml"]).startswith(
        "starting the campaign (s.yaml -> o)"
    )
    assert "from the latest checkpoint in o" in starting_line(
        ["restart-check", "s.yaml", "--out", "o"]
    )


@pytest.mark.process
def test_a_refused_run_ends_its_held_server_before_it_served_or_wrote(tmp_path):
    # The server's process starts right after the first line, held while torch loads and the
    # spec is checked; a refused spec ends it before it opened a port or wrote its database.
    spec = tmp_path / "mine.yaml"
    spec.write_text("name: mine\ncontrol: {}\n")
    home = tmp_path / "home"
    err, got = _campaign("run", str(spec), cwd=tmp_path, home=home)
    assert got["code"] == 2 and "field 'packages'" in err
    (pid,) = got["held"]  # it was started, and held
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or state == "Z", "the held server outlived the run"
    assert not list(home.rglob("*.db")), "a refused run wrote Prefect's database"
