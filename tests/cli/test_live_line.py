"""The live line of ``campaign run`` on an 80-column terminal: it never takes more than one row
of 80 columns, and after log lines and the phase's end nothing stale of it is left on the
screen (the bytes rich writes are played on a small terminal emulator)."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import time

from rich.console import Console

from gpucampaign.cli.progress import LiveView, fit_line, resume_line
from gpucampaign.folder.progress import render_line, render_parts
from tests.helpers import digits_file  # noqa: F401

WIDTH = 80
_CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")


def play(data: str, *, width: int = WIDTH) -> list[str]:
    """The rows a ``width``-column terminal shows after ``data`` (the sequences rich's live
    display writes: cursor up, erase line, carriage return, colours, cursor hide/show)."""
    rows: list[list[str]] = [[]]
    row = col = 0
    pending_wrap = False
    i = 0
    while i < len(data):
        m = _CSI.match(data, i)
        if m:
            arg, cmd = m.groups()
            n = int(arg) if arg.isdigit() else 1
            if cmd == "A":
                row, pending_wrap = max(0, row - n), False
            elif cmd == "B":
                row += n
            elif cmd == "K":
                line = rows[row]
                rows[row] = [] if arg == "2" else line[:col]
            elif cmd == "G":
                col = n - 1
            i = m.end()
            while len(rows) <= row:
                rows.append([])
            continue
        ch = data[i]
        i += 1
        if ch == "\r":
            col, pending_wrap = 0, False
        elif ch == "\n":
            row, col, pending_wrap = row + 1, 0, False
        elif ch == "\x1b":
            continue
        else:
            if pending_wrap:
                row, col, pending_wrap = row + 1, 0, False
            while len(rows) <= row:
                rows.append([])
            line = rows[row]
            line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
            if col == width:
                col, pending_wrap = width - 1, True
        while len(rows) <= row:
            rows.append([])
    return ["".join(r).rstrip() for r in rows]


def _record(step: int, *, state: str = "running") -> dict:
    return {
        "run_id": "wider-lr-schedule-0123456789",
        "run": "wider-lr-schedule",
        "phase": "train",
        "state": state,
        "step": step,
        "target_steps": 12000,
        "planned_steps": 12000,
        "loss": 0.123456,
        "metric": "balanced_accuracy",
        "metric_value": 0.95,
        "metric_step": 11000,
        "steps_per_s": 123.4,
        "eta_s": 4000,
        "elapsed_s": 120,
        "updated_at": time.time(),
    }


def _write(out, record: dict) -> None:
    d = out / "runs" / record["run_id"]
    d.mkdir(parents=True, exist_ok=True)
    (d / "progress.json").write_text(json.dumps({**record, "updated_at": time.time()}))


def test_fit_line_leaves_parts_out_before_it_cuts():
    parts = render_parts(_record(11234))
    full = "  ".join(t for _, t in parts)
    assert len(full) > 79
    line = fit_line(parts, 79)
    assert len(line) <= 79 and "steps/s" not in line and "ETA" in line and "loss" in line
    assert len(fit_line(parts, 20)) == 20


def test_live_line_at_80_columns_fits_and_leaves_nothing_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)
    console = Console(file=screen, force_terminal=True, width=WIDTH, color_system=None)
    assert console.width == WIDTH
    log = logging.getLogger("test_live_line")
    handler = logging.StreamHandler(sys.stderr)  # a library's console handler, like Prefect's
    log.addHandler(handler)
    log.propagate = False
    try:
        view = LiveView(tmp_path, console=console, live=True)
        with view:
            for step in (100, 5000, 9000):
                _write(tmp_path, _record(step))
                view.poll()
                time.sleep(0.15)  # the live display's own refreshes run in between
                log.warning("a log line at step %d", step)
                view.poll()
            _write(tmp_path, _record(12000, state="done"))
            view.poll()
    finally:
        log.removeHandler(handler)
    rows = [r for r in play(screen.getvalue()) if r]
    assert all(len(r) <= WIDTH for r in rows), rows
    # What stays: the three log lines and the phase's final line, once each, in that order;
    # no copy of a live line (they all said ETA) and nothing else.
    assert [r for r in rows if "ETA" in r] == []
    assert rows[:3] == [f"a log line at step {s}" for s in (100, 5000, 9000)]
    # The phase's final line is printed for good, whole (the terminal wraps it).
    assert "".join(rows[3:]) == render_line(_record(12000, state="done")), rows
    # Every live line drawn was one row: at most WIDTH - 1 characters.
    drawn = re.findall(r"train wider-lr-schedule[^\r\n\x1b]*", screen.getvalue())
    assert any("ETA" in d for d in drawn)
    assert all(len(d) < WIDTH for d in drawn if "ETA" in d)


def test_a_resumed_run_is_said_once(tmp_path):
    record = {
        **_record(190),
        "resumed_from": 190,
        "checkpoint": "step-00000190 in file:///x/checkpoints/c-1, saved 2026-12-05 01:00:00 UTC",
    }
    assert resume_line(record) == (
        "resuming wider-lr-schedule from step 190 (checkpoint step-00000190 in "
        "file:///x/checkpoints/c-1, saved 2026-12-05 01:00:00 UTC)"
    )
    screen = io.StringIO()
    view = LiveView(tmp_path, console=Console(file=screen, width=WIDTH), live=False, every_s=0)
    with view:
        _write(tmp_path, record)
        view.poll()
        _write(tmp_path, {**record, "step": 191})
        view.poll()
    assert screen.getvalue().count("resuming wider-lr-schedule from step 190") == 1


def test_an_interrupted_then_resumed_run_says_resuming_from_its_step(tmp_path, digits_file):  # noqa: F811
    """A real run stopped by a Ctrl-C at step 7 and started again: the live view of the output
    folder says ``resuming control from step 7 (checkpoint step-...)`` once; the pilot's
    planned continuation (no interruption) says nothing of the kind."""
    import pytest

    from gpucampaign.core import interrupt
    from gpucampaign.core.interrupt import Interrupted
    from tests.helpers import make_spec, run

    spec = make_spec(tmp_path, digits_file, control={"epochs": 2})
    since = time.time()

    def stop(info: dict) -> None:
        if info["step"] >= 7:
            interrupt.request_stop("SIGINT")

    with pytest.raises(Interrupted) as err:
        run(spec, tmp_path, progress=stop)
    interrupt.clear_stop()
    saved = err.value.step
    screen = io.StringIO()
    view = LiveView(tmp_path / "out", console=Console(file=screen, width=200), live=False)
    with view:
        run(spec, tmp_path)
    said = [ln for ln in screen.getvalue().splitlines() if ln.startswith("resuming")]
    assert len(said) == 1 and said[0].startswith(
        f"resuming control from step {saved} (checkpoint step-{saved:09d} in file://"
    ), screen.getvalue()
    assert " saved 20" in said[0]
    # A pilot's planned continuation is not a resume to announce.
    other = make_spec(tmp_path / "p", digits_file, control={"epochs": 2})
    run(other, tmp_path / "p", stop_after_steps=5)
    screen = io.StringIO()
    with LiveView(tmp_path / "p" / "out", console=Console(file=screen), live=False, since=since):
        run(other, tmp_path / "p")
    assert "resuming" not in screen.getvalue()
