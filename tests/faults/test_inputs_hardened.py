"""Inputs that used to crash or hang the tools, tried from the attacker's side: markup in any
argument, a hand-edited ledger, a malformed mirror index, a FIFO or a device planted as a
progress file, escape codes in a progress field, a spec that grows a list without end, and a
data-parallel run with a remote store.

Each answers with its documented exit code (2: bad input, 4: a folder that does not verify),
one paragraph, no traceback; nothing is written twice and nothing hangs. The fuzzed draws are
derandomized and assert on what is accepted too.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import gpucampaign.storage
from gpucampaign.cli import app
from gpucampaign.close.ledger import LedgerError, parse_ledger, read_ledger
from gpucampaign.config import CampaignSpec, SpecError, load_spec
from gpucampaign.config.parts import (
    MAX_ARGS,
    MAX_CALENDAR_STEPS,
    MAX_EXPENSES,
    MAX_INPUTS,
    MAX_PACKAGES,
    MAX_RUNS,
    MAX_SEEDS,
    MAX_VARIANTS,
)
from gpucampaign.folder.layout import LEDGER_FILE
from gpucampaign.folder.progress import MAX_PROGRESS_BYTES, read_all_progress, render_line
from gpucampaign.preflight import preflight
from gpucampaign.storage import LocalStore, StorageError
from gpucampaign.storage.mirror import MIRROR_INDEX, mirror_folder, retrieve_folder
from tests.helpers.fuzzing import examples

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "campaign.yaml"
BASE = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
FUZZ = settings(
    max_examples=examples(40),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
MARKUP = ["[/]", "[bold]x", "a[/]b[red]", "[link=http://x]y", "x\\"]
runner = CliRunner()


def _cli(faults, args: list[str], *, codes: tuple[int, ...]) -> Any:
    """``campaign ARGS`` in this process: a documented code, never a traceback."""
    faults.add("fuzzed_inputs")
    got = runner.invoke(app, args, catch_exceptions=True)
    if got.exception is not None and not isinstance(got.exception, SystemExit):
        faults.add("tracebacks")
        raise AssertionError(f"campaign {args!r} raised {got.exception!r}") from got.exception
    assert "Traceback" not in got.output, got.output
    assert got.exit_code in codes, (args, got.exit_code, got.output)
    return got


def _one_paragraph(text: str) -> str:
    text = text.strip()
    assert text and "\n\n" not in text, text
    return " ".join(text.split())


# --- markup in any argument --------------------------------------------------------------------
@pytest.mark.parametrize("mark", MARKUP)
@pytest.mark.parametrize(
    "args",
    [
        ["verify", "{tmp}/x{m}"],
        ["report", "{tmp}/x{m}"],
        ["status", "{tmp}/x{m}"],
        ["watch", "--once", "{tmp}/x{m}"],
        ["track", "{tmp}/x{m}"],
        ["plan", "{tmp}/x{m}.yaml"],
        ["pin", "{tmp}/x{m}"],
        ["expense", "{tmp}/x{m}", "--usd", "1", "--what", "x"],
        ["retrieve", "s3://b/x{m}", "--to", "{tmp}/back"],
        ["init", "{tmp}/new", "--example", "x{m}"],
    ],
    ids=lambda a: a[0] if isinstance(a, list) else None,
)
def test_markup_in_an_argument_is_printed_as_text(faults, tmp_path, args, mark):
    argv = [a.format(tmp=tmp_path, m=mark) for a in args]
    got = _cli(faults, argv, codes=(2,))
    said = _one_paragraph(got.output)
    assert said.startswith("error:"), said
    assert not (tmp_path / "new").exists() and not (tmp_path / "back").exists()


@pytest.mark.parametrize("what", ["[/]", "[bold]paid[/bold] in [red]", "x[/]y\\", "ünï 名前"])
def test_an_expense_with_markup_is_recorded_once_and_printed_as_given(faults, out, what):
    got = _cli(faults, ["expense", str(out), "--usd", "3.5", "--what", what], codes=(0,))
    assert what in got.output, got.output
    assert [e.what for e in read_ledger(out)] == [what]  # once: the command did not crash after
    got = _cli(faults, ["verify", str(out), "--no-reload", "--json"], codes=(4,))
    assert json.loads(got.output)["problems"] == []  # 4: only because the models were not reloaded
    report = _cli(faults, ["report", str(out)], codes=(0,))
    assert "3.50" in report.output


@settings(FUZZ, max_examples=examples(25))
@given(
    what=st.text(max_size=40)
    | st.sampled_from(MARKUP).flatmap(lambda m: st.text(max_size=8).map(lambda t: t + m + t)),
    usd=st.sampled_from(["1", "0.01", "0", "-1", "nan", "inf", "1e10", "[/]", "2.5"]),
)
def test_fuzzed_expenses_are_recorded_once_or_refused_with_nothing_written(faults, out, what, usd):
    before = len(read_ledger(out))
    got = _cli(faults, ["expense", str(out), "--usd", usd, "--what", what], codes=(0, 2))
    after = read_ledger(out)
    if got.exit_code == 0:
        assert len(after) == before + 1 and after[-1].what == what.strip()
        assert " ".join(what.split()) in " ".join(got.output.split()), got.output
    else:
        assert len(after) == before
        assert "--usd" in got.output or "--what" in got.output, got.output
    valid_usd = usd in ("1", "0.01", "2.5")
    valid_what = 0 < len(what.strip()) <= 200 and all(
        unicodedata.category(c) not in ("Cc", "Zl", "Zp") and c not in BIDI for c in what.strip()
    )
    assert (got.exit_code == 0) == (valid_usd and valid_what), (what, usd, got.output)


def test_a_refused_expense_writes_nothing(faults, out):
    before = (out / LEDGER_FILE).read_bytes() if (out / LEDGER_FILE).exists() else None
    for args in (
        ["--usd", "inf", "--what", "[/]"],
        ["--usd", "1", "--what", "[/]\n[/]"],
        ["--usd", "1", "--what", "paid\x9b31m"],
        ["--usd", "1", "--what", "paid\u202egpj.exe"],
    ):
        got = _cli(faults, ["expense", str(out), *args], codes=(2,))
        assert "option '--" in _one_paragraph(got.output)
    after = (out / LEDGER_FILE).read_bytes() if (out / LEDGER_FILE).exists() else None
    assert after == before


# --- the ledger, edited by hand ----------------------------------------------------------------
def _line(**row: Any) -> bytes:
    return (json.dumps({"what": "x", "time": "2026-01-01T00:00:00+00:00", **row}) + "\n").encode()


BAD_LEDGER_LINES = [
    b'{"usd": Infinity, "what": "x", "time": "t"}\n',
    b'{"usd": NaN, "what": "x", "time": "t"}\n',
    b'{"usd": -Infinity, "what": "x", "time": "t"}\n',
    b'{"usd": 1e400, "what": "x", "time": "t"}\n',
    b'{"usd": 1e12, "what": "x", "time": "t"}\n',
    b'{"usd": "12", "what": ["x"], "time": "t"}\n',
    b'{"usd": 1, "what": "x", "time": "t", "evil": 1}\n',
    b"[1, 2, 3]\n",
    b"not json\n",
    b"[" * 5000 + b"\n",
]


@pytest.mark.parametrize("bad", BAD_LEDGER_LINES, ids=range(len(BAD_LEDGER_LINES)))
def test_a_bad_ledger_line_fails_verify_and_report_says_so(faults, out, bad):
    _cli(faults, ["expense", str(out), "--usd", "2", "--what", "a real one"], codes=(0,))
    with (out / LEDGER_FILE).open("ab") as f:
        f.write(bad)
    got = _cli(faults, ["verify", str(out), "--no-reload", "--json"], codes=(4,))
    problems = json.loads(got.output)["problems"]
    assert any(p["code"] == "invalid_ledger" for p in problems), problems
    said = _one_paragraph(_cli(faults, ["report", str(out)], codes=(2,)).output)
    assert LEDGER_FILE in said and "line 2 is not an expense" in said, said
    _cli(faults, ["report", str(out), "--json"], codes=(2,))


LEDGER_VALUES = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.text(max_size=5)
    | st.none()
    | st.booleans()
    | st.lists(st.integers(), max_size=2)
)


@FUZZ
@given(usd=LEDGER_VALUES, what=st.text(max_size=30) | st.integers())
def test_fuzzed_ledger_lines_are_expenses_or_a_ledger_error(faults, usd, what):
    faults.add("fuzzed_inputs")
    data = json.dumps({"usd": usd, "what": what, "time": "t"}).encode() + b"\n"
    valid = (
        isinstance(usd, int | float)
        and not isinstance(usd, bool)
        and math.isfinite(usd)
        and 0 < usd <= 1e9
        and round(usd, 2) > 0
        and isinstance(what, str)
        and 0 < len(what.strip()) <= 200
        and all(
            unicodedata.category(c) not in ("Cc", "Zl", "Zp") and c not in BIDI
            for c in what.strip()
        )
    )
    try:
        (entry,) = parse_ledger(data, where=LEDGER_FILE)
    except LedgerError as exc:
        assert not valid, (usd, what, str(exc))
        assert "line 1" in str(exc)
        return
    except Exception:
        faults.add("tracebacks")
        raise
    assert valid, (usd, what)
    assert math.isfinite(entry.usd) and entry.usd == round(usd, 2)


def _campaign(*args: str) -> subprocess.CompletedProcess[str]:
    """``campaign ARGS`` in its own process: a hang fails the test, never blocks it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "gpucampaign.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.slow  # seconds: processes with time-outs (make test runs it)
def test_a_fifo_planted_as_the_ledger_is_refused_never_waited_on(faults, out):
    (out / LEDGER_FILE).unlink(missing_ok=True)
    os.mkfifo(out / LEDGER_FILE)
    faults.add("fuzzed_inputs", 3)
    verify = _campaign("verify", str(out), "--no-reload", "--json")
    assert verify.returncode == 4, verify.stderr
    problems = json.loads(verify.stdout)["problems"]
    assert any(p["code"] == "invalid_ledger" for p in problems), problems
    for args in (["expense", str(out), "--usd", "1", "--what", "x"], ["report", str(out)]):
        got = _campaign(*args)
        assert got.returncode == 2, (args, got.stdout, got.stderr)
        said = _one_paragraph(got.stderr + got.stdout)
        assert "not a regular file" in said and "Traceback" not in said, said
    assert (out / LEDGER_FILE).is_fifo()


def test_a_torn_last_line_is_left_out_and_an_empty_ledger_reads_empty(tmp_path):
    (tmp_path / "spec.yaml").write_text("name: x\n")
    assert read_ledger(tmp_path) == []
    (tmp_path / LEDGER_FILE).write_bytes(_line(usd=2) + b'{"usd": 3, "wh')
    assert [e.usd for e in read_ledger(tmp_path)] == [2.0]


# --- the mirror index --------------------------------------------------------------------------
BAD_INDEXES = [
    b"not json",
    b"[]",
    b'{"files": []}',
    b'{"files": {"a": 5}}',
    b'{"files": {"a": {"bytes": "5", "sha256": "00"}}}',
    b'{"files": {"a": {"bytes": 5}}}',
    b'{"files": {"../../etc/passwd": {"bytes": 1, "sha256": "' + b"0" * 64 + b'"}}}',
    b'{"files": {"/abs": {"bytes": 1, "sha256": "' + b"0" * 64 + b'"}}}',
    b'{"files": {"a": {"bytes": -1, "sha256": "' + b"0" * 64 + b'"}}}',
    b'{"files": {"a": {"bytes": 1e400, "sha256": "' + b"0" * 64 + b'"}}}',
    b'{"files": ' + b"[" * 5000 + b"}",
    b"\xff\xfe",
]


@pytest.mark.parametrize("index", BAD_INDEXES, ids=range(len(BAD_INDEXES)))
def test_a_malformed_mirror_index_is_refused_before_anything_is_fetched(
    faults, tmp_path, monkeypatch, index
):
    bucket = LocalStore(tmp_path / "bucket")
    bucket.write_bytes(MIRROR_INDEX, data=index)
    faults.add("fuzzed_inputs")
    with pytest.raises(StorageError, match="is not a mirror index|store key"):
        retrieve_folder(bucket, dest=tmp_path / "back")
    assert not (tmp_path / "back").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bucket"]

    opened = lambda url, **kw: bucket  # noqa: E731 - the bucket a URL names
    monkeypatch.setattr(gpucampaign.storage, "open_store", opened)
    for module in ("gpucampaign.cli.output",):
        if hasattr(sys.modules.get(module), "open_store"):
            monkeypatch.setattr(f"{module}.open_store", opened)
    got = _cli(
        faults, ["retrieve", "s3://bucket/prefix", "--to", str(tmp_path / "back")], codes=(2,)
    )
    said = _one_paragraph(got.output)
    assert "cannot retrieve s3://bucket/prefix" in said, said
    assert not (tmp_path / "back").exists()


def test_a_malformed_index_does_not_stop_the_next_mirror(tmp_path):
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "a.json").write_text("{}")
    bucket = LocalStore(tmp_path / "bucket")
    bucket.write_bytes(MIRROR_INDEX, data=b'{"files": []}')
    assert mirror_folder(out, store=bucket)["uploaded"] == 1
    assert retrieve_folder(bucket, dest=tmp_path / "back")["files"] == 1


# --- watch: a FIFO, a device, escape codes ----------------------------------------------------
def _watch_folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "spec.yaml").write_bytes(EXAMPLE.read_bytes())
    return out


def _watch_once(out: Path) -> subprocess.CompletedProcess[str]:
    """``campaign watch --once OUT`` in its own process: a hang fails the test, never blocks it."""
    return _campaign("watch", "--once", str(out))


@pytest.mark.slow  # seconds: processes with time-outs (make test runs it)
def test_watch_skips_a_fifo_a_device_link_and_a_huge_file_promptly(faults, tmp_path):
    out = _watch_folder(tmp_path)
    for run in ("fifo-0000000001", "zero-0000000002", "huge-0000000003", "good-0000000004"):
        (out / "runs" / run).mkdir()
    os.mkfifo(out / "runs" / "fifo-0000000001" / "progress.json")
    os.symlink("/dev/zero", out / "runs" / "zero-0000000002" / "progress.json")
    (out / "runs" / "huge-0000000003" / "progress.json").write_bytes(
        b'{"run": "' + b"x" * (MAX_PROGRESS_BYTES + 10) + b'"}'
    )
    good = {"run": "good", "phase": "train", "step": 3, "state": "done", "updated_at": 1.0}
    (out / "runs" / "good-0000000004" / "progress.json").write_text(json.dumps(good))
    faults.add("fuzzed_inputs", 3)
    started = time.monotonic()
    got = _watch_once(out)
    assert time.monotonic() - started < 90
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stdout + got.stderr
    assert "runs/fifo-0000000001/progress.json is not a regular file" in got.stdout
    assert "runs/zero-0000000002/progress.json is a link (not followed)" in got.stdout
    assert f"runs/huge-0000000003/progress.json is larger than {MAX_PROGRESS_BYTES}" in got.stdout
    assert "train good  3/None" in got.stdout


ESCAPES = [
    "\x1b]0;owned\x07",
    "\x1b[2J\x1b[H",
    "\x1b[31mred",
    "\x9b31m",
    "\x07\x08\r",
    "\u202etxt.exe",
    "\x1bP+q\x1b\\",
]


@pytest.mark.slow  # seconds: processes with time-outs (make test runs it)
def test_escape_codes_in_a_progress_field_do_not_reach_the_terminal(faults, tmp_path):
    out = _watch_folder(tmp_path)
    fields = ("run", "phase", "metric", "state", "step", "target_steps", "metric_step")
    for i, esc in enumerate(ESCAPES):
        run = out / "runs" / f"r{i}-0000000000"
        run.mkdir()
        rec = {k: f"{esc}v" for k in fields} | {"updated_at": 1.0 + i, "metric_value": 0.5}
        (run / "progress.json").write_text(json.dumps(rec))
    faults.add("fuzzed_inputs", len(ESCAPES))
    got = _watch_once(out)
    assert got.returncode == 0, got.stderr
    shown = got.stdout
    assert "\x1b" not in shown and "\x9b" not in shown and "\x07" not in shown
    assert "\u202e" not in shown and "\r" not in shown and "\x08" not in shown
    assert shown.count("v in ?") == len(ESCAPES), shown  # every record still has its line


@FUZZ
@given(
    record=st.dictionaries(
        st.sampled_from(
            [
                "run",
                "run_id",
                "phase",
                "step",
                "target_steps",
                "planned_steps",
                "loss",
                "metric",
                "metric_value",
                "metric_step",
                "steps_per_s",
                "eta_s",
                "elapsed_s",
                "state",
                "updated_at",
            ]
        ),
        st.floats(allow_nan=True, allow_infinity=True)
        | st.integers(min_value=-(10**400), max_value=10**400)
        | st.text(max_size=200)
        | st.booleans()
        | st.none()
        | st.lists(st.text(max_size=3), max_size=3),
    )
)
def test_any_progress_record_renders_one_printable_line(faults, record):
    faults.add("fuzzed_inputs")
    try:
        line = render_line(record)
    except Exception:
        faults.add("tracebacks")
        raise
    assert line.isprintable(), repr(line)
    assert len(line) < 1200


def test_read_all_progress_names_what_it_skipped(tmp_path):
    out = _watch_folder(tmp_path)
    (out / "runs" / "a").mkdir()
    os.mkfifo(out / "runs" / "a" / "progress.json")
    (out / "runs" / "b").mkdir()
    (out / "runs" / "b" / "progress.json").write_text('{"run": "b", "updated_at": "soon"}')
    skipped: list[str] = []
    records = read_all_progress(out, skipped=skipped)
    assert [r["run"] for r in records] == ["b"]
    assert skipped == ["runs/a/progress.json is not a regular file: left out of the live view"]


# --- bounds on every list a spec can grow ------------------------------------------------------
def _spec_with(path: tuple, n: int) -> dict[str, Any]:
    """The example spec with ``n`` entries in the list or mapping at ``path``."""
    data = copy.deepcopy(BASE)
    data["control"]["seeds"] = []
    steps = data["calendar"]
    if path == ("control", "seeds"):
        data["control"]["seeds"] = list(range(n))
    elif path == ("variants", 0, "seeds"):
        data["variants"][0]["seeds"] = list(range(n))
    elif path == ("packages",):
        data["packages"] = [data["packages"][0]] * n
    elif path == ("calendar",):
        data["calendar"] = steps + [
            {"name": f"extra-{i}", "kind": "human", "hours": 0.01} for i in range(n - len(steps))
        ]
    elif path == ("calendar", 0, "after"):
        data["calendar"] = [{**steps[0], "after": ["x"] * n}, *steps[1:]]
    elif path == ("variants",):
        data["variants"] = [
            {"name": f"v{i}", "tier": "exploratory", "changes": {"lr": 0.001 + i * 1e-6}}
            for i in range(n)
        ]
    elif path == ("expenses",):
        data["expenses"] = [{"name": f"e{i}", "usd": 1} for i in range(n)]
    elif path == ("inputs",):
        data["inputs"] = {f"i{i}": {"path": "x", "sha256": "0" * 64} for i in range(n)}
    elif path == ("control", "args"):
        data["control"]["args"] = {f"a{i}": i for i in range(n)}
    elif path == ("variants", 0, "changes"):
        data["variants"][0]["changes"] = {f"a{i}": i for i in range(n)}
    return data


BOUNDS = [
    (("control", "seeds"), MAX_SEEDS),
    (("variants", 0, "seeds"), MAX_SEEDS),
    (("packages",), MAX_PACKAGES),
    (("calendar",), MAX_CALENDAR_STEPS),
    (("calendar", 0, "after"), MAX_CALENDAR_STEPS),
    (("variants",), MAX_VARIANTS),
    (("expenses",), MAX_EXPENSES),
    (("inputs",), MAX_INPUTS),
    (("control", "args"), MAX_ARGS),
    (("variants", 0, "changes"), MAX_ARGS),
]


@pytest.mark.parametrize(("path", "bound"), BOUNDS, ids=lambda x: str(x))
def test_every_list_past_its_bound_is_refused_naming_it(faults, path, bound):
    faults.add("fuzzed_inputs")
    started = time.monotonic()
    with pytest.raises(Exception) as err:
        CampaignSpec.model_validate(_spec_with(path, bound + 1))
    assert time.monotonic() - started < 10
    named = ".".join(str(p) for p in path if not isinstance(p, int))
    assert f"at most {bound}" in str(err.value) or str(bound) in str(err.value)
    assert path[-1] in str(err.value) or named in str(err.value), str(err.value)


@FUZZ
@given(n=st.integers(min_value=0, max_value=3 * MAX_SEEDS))
def test_a_seed_count_is_accepted_exactly_up_to_its_bound(faults, n):
    faults.add("fuzzed_inputs")
    try:
        spec = CampaignSpec.model_validate(_spec_with(("control", "seeds"), n))
    except Exception as exc:
        assert n > MAX_SEEDS, (n, str(exc)[:300])
        assert "control.seeds" in str(exc) or "seeds" in str(exc)
        return
    assert n <= MAX_SEEDS
    assert len(spec.run_names()) == len(BASE["variants"]) + max(1, n)


@pytest.mark.slow  # seconds of YAML parsing (make test runs it)
def test_100000_seeds_are_refused_quickly_naming_the_field(faults, tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(_spec_with(("control", "seeds"), 100_000)))
    faults.add("fuzzed_inputs")
    started = time.monotonic()
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert time.monotonic() - started < 120  # the YAML of 100,000 values; was a hang
    said = _one_paragraph(str(err.value))
    assert "control.seeds" in said and f"at most {MAX_SEEDS}" in said, said


def test_too_many_runs_in_all_are_refused(faults):
    data = _spec_with(("variants",), MAX_RUNS // MAX_SEEDS + 1)
    for i, v in enumerate(data["variants"]):
        v["seeds"] = list(range(i * MAX_SEEDS, (i + 1) * MAX_SEEDS))
    faults.add("fuzzed_inputs")
    with pytest.raises(Exception, match=f"more than the {MAX_RUNS}"):
        CampaignSpec.model_validate(data)


def test_a_large_allowed_campaign_plans_in_bounded_time(tmp_path):
    from gpucampaign.plan import calendar

    data = copy.deepcopy(BASE)
    data["control"]["seeds"] = list(range(MAX_SEEDS))
    for i, v in enumerate(data["variants"]):
        v["seeds"] = list(range((i + 1) * MAX_SEEDS, (i + 2) * MAX_SEEDS))
    spec = CampaignSpec.model_validate(data)
    started = time.monotonic()
    runs = spec.runs_by_tier()
    assert len(runs) == (len(BASE["variants"]) + 1) * MAX_SEEDS
    assert spec.replicate_of(f"control.s{MAX_SEEDS - 1}") == ("control", MAX_SEEDS - 1)
    assert spec.replicate_of("control.s\u0663") is None  # a non-ASCII digit is no seed
    result = calendar.plan(spec, base_dir=EXAMPLE.parent)
    assert result.fits in (True, False)
    assert time.monotonic() - started < 60  # quadratic before: minutes for this many runs


# --- a data-parallel run with a remote store --------------------------------------------------
@pytest.mark.parametrize("where", ["control", "variant"])
def test_gpus_above_one_with_s3_storage_is_refused_by_the_preflight(
    faults, tmp_path, monkeypatch, where
):
    import gpucampaign.preflight.checks as checks

    def no_probe(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the store was probed before the refusal")

    monkeypatch.setattr(checks, "check_storage", no_probe)
    data = copy.deepcopy(BASE)
    data["storage"] = {"url": "s3://bucket/campaigns"}
    if where == "control":
        data["control"]["gpus"] = 2
    else:
        data["variants"][1]["changes"] = {"gpus": 2}
    spec_path = tmp_path / "campaign.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    shutil.copytree(EXAMPLE.parent / "data", tmp_path / "data")
    spec = load_spec(spec_path)
    with pytest.raises(SpecError) as err:
        preflight(spec, base_dir=tmp_path, env={})
    said = _one_paragraph(str(err.value))
    assert "gpus" in said and "storage.url" in said and "gpus: 1" in said, said
    faults.add("preflight_refusals")
    got = _cli(faults, ["plan", str(spec_path)], codes=(2,))
    assert "storage.url" in " ".join(got.output.split())
    # On a lot whose machine has the 2 GPUs (one rtx4090 has 1: a refusal of its own).
    local = {**data, "storage": {"url": "local"}}
    local["packages"] = [{"gpu": "b200", "days": 3, "price_usd": 900}]
    spec_path.write_text(yaml.safe_dump(local))
    monkeypatch.undo()
    preflight(load_spec(spec_path), base_dir=tmp_path, env={})  # accepted with local storage
