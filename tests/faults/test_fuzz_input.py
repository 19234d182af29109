"""Bad input, fuzzed: random YAML, wrong types, huge and negative numbers, unicode and control
characters, path tricks. Every command answers with a message and its documented exit code,
never a traceback, and an existing output folder is left exactly as it was.

Every numeric field of the spec's JSON schema (read from the schema, not from an example) takes
any value within its bounds and refuses NaN, the infinities and anything past its bounds. The
draws are derandomized: a failure replays the same way anywhere. The fast run (``make
test-fast``) draws a quarter of each count (``tests/helpers/fuzzing.py``); a full run all of them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import gpucampaign.cli.runner
from gpucampaign.cli import app
from gpucampaign.config import CampaignSpec, SpecError, load_spec
from tests.helpers.fuzzing import examples

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "campaign.yaml"
FUZZ = settings(
    max_examples=examples(40),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FEW = settings(FUZZ, max_examples=examples(15))

# Values of the wrong kind for any field.
WEIRD_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20
) | st.sampled_from(
    [
        "../../etc/passwd",
        "/etc/passwd",
        "~",
        "~/x",
        "a/../../b",
        "\u202eevil",
        "x\ty",
        "x\ny",
        "\x1b[31mred",
        "ünïcødé",
        "名前",
        "C:\\Windows",
        "\\\\server\\share",
        "",
        " ",
        "NaN",
        "-1",
    ]
)
BAD_NUMBERS = (
    st.sampled_from([-1, 0, -(10**30), 10**30, 1e308, -1e308, 1e-308, 2**63, -(2**63)])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers()
)
BAD_VALUES = (
    WEIRD_TEXT
    | BAD_NUMBERS
    | st.booleans()
    | st.none()
    | st.lists(st.integers(), max_size=3)
    | st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)
)
YAML_DATA = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | WEIRD_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(WEIRD_TEXT, inner, max_size=4),
    max_leaves=12,
)


def _leaf_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in a spec mapping (containers included: they can be replaced too)."""
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _leaf_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _leaf_paths(v, (*prefix, i))
    return out


BASE = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
PATHS = _leaf_paths(BASE)


def _replace(data: Any, path: tuple, value: Any) -> Any:
    data = copy.deepcopy(data)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _folder_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


class PrefectWouldStart(Exception):
    """Raised instead of starting Prefect: the command got past every check of its input."""


@pytest.fixture
def no_prefect(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PrefectWouldStart()

    monkeypatch.setattr(gpucampaign.cli.runner, "load_flow", refuse)


@pytest.fixture
def out_folder(tmp_path_factory) -> Path:
    """An existing output folder of the digits campaign (spec copy, plan, a run's files)."""
    root = tmp_path_factory.mktemp("existing-out")
    (root / "spec.yaml").write_bytes(EXAMPLE.read_bytes())
    (root / "plan.json").write_text(json.dumps({"name": "digits", "steps": []}))
    (root / "runs" / "control-0123456789").mkdir(parents=True)
    (root / "runs" / "control-0123456789" / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 1}\n'
    )
    (root / "report.json").write_text(json.dumps({"campaign_id": "digits-x", "verdict": {}}))
    return root


def invoke(faults, args: list[str], *, codes: tuple[int, ...] = (2,)) -> Any:
    """Run ``campaign ARGS`` in this process; fail on a traceback or an undocumented code."""
    faults.add("fuzzed_inputs")
    result = CliRunner().invoke(app, args, catch_exceptions=True)
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit | PrefectWouldStart):
        faults.add("tracebacks")
        raise AssertionError(f"campaign {args!r} raised {exc!r}") from exc
    text = result.output + (
        getattr(result, "stderr", "") if result.stderr_bytes is not None else ""
    )
    assert "Traceback" not in text, text
    if isinstance(exc, PrefectWouldStart):
        return result
    assert result.exit_code in codes, (args, result.exit_code, text)
    return result


def load(faults, path: Path) -> Any:
    """``load_spec(path)``: a spec, or a ``SpecError`` returned; anything else is a traceback."""
    faults.add("fuzzed_inputs")
    try:
        return load_spec(path)
    except SpecError as exc:
        return exc
    except Exception:
        faults.add("tracebacks")
        raise


def _write(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


# --- the spec loader -------------------------------------------------------------------------
@FUZZ
@given(data=YAML_DATA)
def test_random_yaml_is_a_spec_error(tmp_path_factory, faults, data):
    path = _write(tmp_path_factory.mktemp("spec") / "campaign.yaml", data)
    err = load(faults, path)
    assert isinstance(err, SpecError) and "campaign.yaml" in str(err)


@FUZZ
@given(
    raw=st.binary(max_size=200) | st.text(max_size=200).map(lambda s: s.encode("utf-8", "replace"))
)
def test_random_bytes_are_a_spec_error(tmp_path_factory, faults, raw):
    path = tmp_path_factory.mktemp("spec") / "campaign.yaml"
    path.write_bytes(raw)
    err = load(faults, path)
    assert isinstance(err, SpecError) and "campaign.yaml" in str(err)


@FUZZ
@given(path=st.sampled_from(PATHS), value=BAD_VALUES)
def test_a_bad_field_is_named(tmp_path_factory, faults, path, value):
    spec = _write(tmp_path_factory.mktemp("spec") / "campaign.yaml", _replace(BASE, path, value))
    exc = load(faults, spec)
    if isinstance(exc, SpecError):
        top = str(path[0]).removesuffix("s")  # "variant 'bf16': ..." names a variant
        assert top in str(exc) or top in exc.field, (path, value, str(exc))


# --- every numeric field of the schema ---------------------------------------------------------
def numeric_fields(schema: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    """``{path: its schema}`` of every number and integer the JSON schema describes; a path
    steps into the first item of a list (``0``) and any entry of a mapping (``"*"``)."""
    defs = schema.get("$defs", {})
    found: dict[tuple, dict[str, Any]] = {}

    def walk(node: dict[str, Any], path: tuple) -> None:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        for alt in node.get("anyOf", ()):  # an optional field: its type and null
            walk(alt, path)
        kind = node.get("type")
        if kind in ("number", "integer"):
            found[path] = node
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, (*path, key))
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], (*path, "*"))
        if isinstance(node.get("items"), dict):
            walk(node["items"], (*path, 0))

    walk(schema, ())
    return found


NUMERIC = numeric_fields(CampaignSpec.model_json_schema())
#: The example spec with every list and mapping the schema's numbers live in filled.
FULL = {
    **BASE,
    "window_hours": 72,
    "inputs": {"base": {"path": "base.bin", "sha256": "0" * 64}},
    "expenses": [{"name": "egress", "usd": 1.5}],
    "control": {**BASE["control"], "max_steps": 1000, "seeds": [0, 1]},
    "variants": [{**BASE["variants"][0], "seeds": [3]}, *BASE["variants"][1:]],
    "checkpoint": {**BASE["checkpoint"], "every_steps": 50},
    "stop_rules": {**BASE["stop_rules"], "quality_floor": 0.8},
}


def _put(data: Any, path: tuple, value: Any) -> Any:
    """``data`` with ``value`` at the schema ``path`` (missing mappings made on the way)."""
    data = copy.deepcopy(data)
    node = data
    for key, nxt in zip(path[:-1], path[1:], strict=True):
        if key == "*":
            key = next(iter(node))
        child = node[key] if isinstance(node, list) else node.get(key)
        if child is None:
            child = [] if nxt == 0 else {}
            node[key] = child
        node = child
    last = path[-1]
    if isinstance(node, list) and not node:
        node.append(value)
    else:
        node[last] = value
    return data


def _named(path: tuple) -> str:
    """A schema path as the spec errors name it: ``calendar[0].hours``."""
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else ("." if text else "") + str(key)
    return text


def _bounds(node: dict[str, Any]) -> tuple[Any, Any]:
    """The lowest and highest value ``node`` accepts (``None``: unbounded)."""
    step = 1 if node["type"] == "integer" else 0
    low = node.get("minimum", None if "exclusiveMinimum" not in node else node["exclusiveMinimum"])
    high = node.get("maximum", None if "exclusiveMaximum" not in node else node["exclusiveMaximum"])
    if "exclusiveMinimum" in node:
        low += step
    if "exclusiveMaximum" in node:
        high -= step
    return low, high


def within(node: dict[str, Any]) -> st.SearchStrategy:
    """Values the field must take."""
    low, high = _bounds(node)
    if node["type"] == "integer":
        return st.integers(min_value=low, max_value=high) | st.sampled_from([low, high])
    finite = st.floats(
        min_value=low,
        max_value=high,
        exclude_min="exclusiveMinimum" in node,
        exclude_max="exclusiveMaximum" in node,
        allow_nan=False,
        allow_infinity=False,
    )
    edges = [
        x
        for x, key in ((low, "minimum"), (high, "maximum"))
        if x is not None and key in node  # an inclusive bound is a value the field takes
    ]
    return finite | st.sampled_from(edges or [1.0])


def beyond(node: dict[str, Any]) -> st.SearchStrategy:
    """Values the field must refuse: not numbers, and anything past its bounds."""
    low, high = _bounds(node)
    out = [math.nan, math.inf, -math.inf]
    if high is not None:
        out += [high + 1, high * 2 + 1, 2**63, 10**30]
    if low is not None and not (node["type"] == "number" and "exclusiveMinimum" not in node):
        out += [low - 1, -(2**63)]
    elif low is not None:
        out += [low - 1.0]
    return st.sampled_from(out)


def test_the_schema_bounds_every_count():
    """Every integer of the schema has an upper limit; every field is reached below."""
    assert len(NUMERIC) >= 30, sorted(NUMERIC)
    unbounded = [
        _named(p) for p, n in NUMERIC.items() if n["type"] == "integer" and None in _bounds(n)
    ]
    assert not unbounded, unbounded
    for path in NUMERIC:  # FULL holds every container a numeric field lives in
        _put(FULL, path, 1)
    assert not isinstance(load_spec(_write_tmp(FULL)), SpecError)


def _write_tmp(data: Any) -> Path:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="fuzz-spec-"))
    return _write(folder / "campaign.yaml", data)


@pytest.mark.parametrize("path", sorted(NUMERIC, key=_named), ids=_named)
@settings(FUZZ, max_examples=examples(8))
@given(data=st.data())
def test_every_numeric_field_takes_its_range_and_refuses_the_rest(
    tmp_path_factory, faults, path, data
):
    node = NUMERIC[path]
    folder = tmp_path_factory.mktemp("spec")
    good = data.draw(within(node), label="within")
    got = load(faults, _write(folder / "campaign.yaml", _put(FULL, path, good)))
    assert not isinstance(got, SpecError), (_named(path), good, str(got))
    bad = data.draw(beyond(node), label="beyond")
    err = load(faults, _write(folder / "campaign.yaml", _put(FULL, path, bad)))
    assert isinstance(err, SpecError), f"{_named(path)} = {bad!r} was accepted"
    assert f"field '{_named(path)}'" in str(err), (bad, str(err))
    faults.add("preflight_refusals")


# --- the commands that take a spec ------------------------------------------------------------
@FEW
@given(path=st.sampled_from(PATHS), value=BAD_VALUES)
def test_plan_and_run_refuse_a_bad_spec(
    tmp_path_factory, faults, no_prefect, out_folder, path, value
):
    base = tmp_path_factory.mktemp("spec")
    spec = _write(base / "campaign.yaml", _replace(BASE, path, value))
    before = _folder_hashes(out_folder)
    invoke(faults, ["plan", str(spec), "--json"], codes=(0, 2, 4))
    valid = not isinstance(load(faults, spec), SpecError)
    result = invoke(faults, ["run", str(spec), "--out", str(out_folder)])
    # A spec other than the one the folder holds is refused before Prefect starts.
    assert not isinstance(result.exception, PrefectWouldStart)
    if not valid:
        invoke(faults, ["restart-check", str(spec), "--json"])
    assert _folder_hashes(out_folder) == before


@FEW
@given(data=YAML_DATA)
def test_run_refuses_random_yaml_before_prefect(tmp_path_factory, faults, no_prefect, data):
    spec = _write(tmp_path_factory.mktemp("spec") / "campaign.yaml", data)
    out = tmp_path_factory.mktemp("out")
    result = invoke(faults, ["run", str(spec), "--out", str(out / "new")])
    assert not isinstance(result.exception, PrefectWouldStart)
    assert not (out / "new").exists()


def test_run_refuses_an_out_that_is_a_file(tmp_path, faults, no_prefect):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    result = invoke(faults, ["run", str(EXAMPLE), "--out", str(target)])
    assert not isinstance(result.exception, PrefectWouldStart)
    assert "--out" in result.output or "out" in result.output
    assert target.read_text() == "keep me"


# --- path tricks for every argument that names a file or a folder ---------------------------
PATH_TRICKS = st.sampled_from(
    [
        "../../../../etc",
        "/etc",
        "/",
        "~",
        "~root",
        "/dev/null",
        "/proc/self",
        "a\x00b",
        "..",
        ".",
        "nonexistent/../../x",
        "\u202e",
        "x\x1by",
        "名前",
        " ",
        "-",
    ]
) | st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12
)


@FUZZ
@given(trick=PATH_TRICKS)
def test_folder_arguments_with_path_tricks(faults, out_folder, no_prefect, trick):
    assume(not trick.startswith("-"))
    before = _folder_hashes(out_folder)
    invoke(faults, ["verify", trick, "--no-reload"], codes=(2, 4))
    invoke(faults, ["report", trick], codes=(2,))
    invoke(faults, ["plan", trick], codes=(2,))
    invoke(faults, ["restart-check", trick], codes=(2,))
    invoke(faults, ["restart-check", str(EXAMPLE), "--out", trick], codes=(2, 3))
    invoke(faults, ["run", trick, "--out", str(out_folder)], codes=(2,))
    invoke(faults, ["packages", "--hours", "10", "--catalog", trick], codes=(2,))
    invoke(faults, ["plan", str(EXAMPLE), "--calibrate-from", trick], codes=(2,))
    assert _folder_hashes(out_folder) == before


@FUZZ
@given(
    hours=st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.0, -0.0, 1e308, 5e-324])
)
def test_packages_hours(faults, hours):
    result = invoke(faults, ["packages", "--hours", repr(hours), "--json"], codes=(0, 2, 4))
    if not (math.isfinite(hours) and hours > 0):
        assert result.exit_code == 2 and "--hours" in result.output


# --- files inside an output folder that are not what they claim ------------------------------
@FUZZ
@given(
    name=st.sampled_from(
        ["report.json", "manifest.json", "estimates.json", "report.md", "plan.json"]
    ),
    content=st.binary(max_size=64) | YAML_DATA.map(lambda d: json.dumps(d).encode()),
)
def test_a_corrupt_file_in_the_output_folder(tmp_path_factory, faults, name, content):
    root = tmp_path_factory.mktemp("out")
    (root / "spec.yaml").write_bytes(EXAMPLE.read_bytes())
    (root / name).write_bytes(content)
    before = _folder_hashes(root)
    invoke(faults, ["verify", str(root), "--no-reload", "--json"], codes=(4,))
    invoke(faults, ["report", str(root), "--json"], codes=(0, 2))
    invoke(faults, ["plan", str(EXAMPLE), "--calibrate-from", str(root), "--json"], codes=(0, 2, 4))
    assert _folder_hashes(root) == before


def test_no_command_writes_in_a_folder_named_by_path_tricks(
    tmp_path, faults, no_prefect, monkeypatch
):
    """Relative tricks run from an empty folder create nothing there or above it."""
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for trick in ("../../x", "../b", "~", "."):
        invoke(faults, ["verify", trick, "--no-reload"], codes=(2, 4))
        invoke(faults, ["report", trick], codes=(2,))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b"]
    assert os.listdir(work) == []


MANIFEST_PARTS = st.fixed_dictionaries(
    {
        "files": st.lists(
            YAML_DATA
            | st.fixed_dictionaries(
                {"path": WEIRD_TEXT | PATH_TRICKS, "size": BAD_NUMBERS, "sha256": WEIRD_TEXT}
            ),
            max_size=4,
        )
    },
    optional={
        "runs": YAML_DATA,
        "corpus": YAML_DATA,
        "plan_sha256": YAML_DATA,
        "spec_sha256": YAML_DATA,
    },
)


@pytest.mark.slow
@FUZZ
@given(manifest=MANIFEST_PARTS)
def test_a_manifest_of_the_wrong_shape(tmp_path_factory, faults, manifest):
    root = tmp_path_factory.mktemp("out")
    (root / "spec.yaml").write_bytes(EXAMPLE.read_bytes())
    (root / "manifest.json").write_text(json.dumps(manifest))
    before = _folder_hashes(root)
    invoke(faults, ["verify", str(root), "--no-reload", "--json"], codes=(4,))
    assert _folder_hashes(root) == before


@FEW
@given(name=WEIRD_TEXT, big=st.integers(min_value=401) | st.integers(max_value=1))
def test_bad_options_are_refused_before_any_work(tmp_path_factory, faults, no_prefect, name, big):
    """Unknown run or decision names, step counts out of range: exit 2, nothing trained."""
    assume(
        name not in ("control", "lr-high", "bf16", "short", "auto", "ask")
        and not name.startswith("-")
    )
    out = tmp_path_factory.mktemp("out") / "new"
    invoke(faults, ["restart-check", str(EXAMPLE), "--run", name])
    invoke(faults, ["restart-check", str(EXAMPLE), "--steps", str(big)])
    invoke(faults, ["restart-check", str(EXAMPLE), "--at", str(-abs(big))])
    result = invoke(faults, ["run", str(EXAMPLE), "--out", str(out), "--decision", name])
    assert not isinstance(result.exception, PrefectWouldStart) and not out.exists()
