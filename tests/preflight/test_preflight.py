"""The one preflight of `campaign plan`, `campaign run` and the deployment flow: every input a
campaign needs is refused before anything starts (exit 2, one paragraph naming the field or
file, no traceback, no output folder), and `campaign plan` says what it checked."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import gpucampaign.cli.runner
from gpucampaign.cli import app
from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.cli.scaffold_textlm import init_textlm
from gpucampaign.data.pins import input_sha256


class PrefectWouldStart(Exception):
    """Raised instead of starting Prefect: the command got past every check of its input."""


@pytest.fixture(autouse=True)
def no_prefect(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise PrefectWouldStart()

    monkeypatch.setattr(gpucampaign.cli.runner, "load_flow", refuse)


def campaign(*args: str) -> tuple[int, str]:
    """``campaign ARGS`` in this process: the exit code and everything it printed."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"campaign {args} raised {result.exception!r}") from result.exception
    text = result.output
    try:
        text += result.stderr
    except ValueError:  # stderr mixed into output
        pass
    return result.exit_code, " ".join(text.split())


def edit(spec: Path, change: Callable[[dict], Any]) -> Path:
    data = yaml.safe_load(spec.read_text())
    change(data)
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def repin(spec: Path) -> None:
    """Pin the corpus as it now is (a test that changes it on purpose)."""
    path = spec.parent / yaml.safe_load(spec.read_text())["corpus"]["path"]
    edit(spec, lambda d: d["corpus"].update(sha256=input_sha256(path)))


def refused(spec: Path, tmp_path: Path, *named: str) -> str:
    """Both `plan` and `run` refuse ``spec``: exit 2, every string of ``named`` in the one
    paragraph, no traceback, and `run` creates no output folder."""
    out = tmp_path / "out-new"
    code, text = campaign("plan", str(spec))
    assert code == 2, text
    for name in named:
        assert name in text, (name, text)
    assert "Traceback" not in text and "checked:" not in text
    code, ran = campaign("run", str(spec), "--out", str(out))
    assert code == 2 and "Traceback" not in ran, ran
    assert not out.exists()
    return text


@pytest.fixture
def digits(tmp_path: Path) -> Path:
    """A ready `campaign init` digits campaign (a built-in recipe on a pinned table)."""
    return init_campaign(tmp_path / "digits")


@pytest.fixture
def textlm(tmp_path: Path) -> Path:
    """A ready `campaign init --example textlm` campaign (the user's own recipe file)."""
    return init_textlm(tmp_path / "textlm")


# --- the recipe ------------------------------------------------------------------------------
def test_a_recipe_module_that_does_not_import(textlm: Path, tmp_path: Path) -> None:
    (textlm.parent / "textlm.py").write_text("import no_such_module_xyz\n")
    refused(textlm, tmp_path, "textlm:CharLM", "does not import", "no_such_module_xyz")


def test_a_wrong_class_name(textlm: Path, tmp_path: Path) -> None:
    edit(textlm, lambda d: d["control"].update(recipe="textlm:CharLm"))
    refused(textlm, tmp_path, "textlm:CharLm", "has no 'CharLm'")


def test_a_metric_that_evaluate_does_not_return(textlm: Path, tmp_path: Path) -> None:
    edit(textlm, lambda d: d["decision_rule"].update(metric="perplexity"))
    refused(textlm, tmp_path, "textlm:CharLM", "evaluate()", "did not return 'perplexity'")


def _add_methods(textlm: Path, methods: str) -> None:
    """Add ``methods`` (indented as the class body) to the textlm recipe class."""
    path = textlm.parent / "textlm.py"
    text = path.read_text()
    marker = "    def evaluate(self, model, batches):"
    assert marker in text
    path.write_text(text.replace(marker, methods + "\n" + marker, 1))


def test_a_predict_that_raises_is_refused_before_anything_trains(
    textlm: Path, tmp_path: Path
) -> None:
    _add_methods(
        textlm,
        "    def predict(self, model, batch):\n        raise KeyError('no column named label')\n",
    )
    text = refused(textlm, tmp_path, "textlm:CharLM", "predict()", "no column named label")
    assert "'test' split" in text  # the split predictions.csv is written from


def test_a_predict_that_returns_no_rows_is_refused(textlm: Path, tmp_path: Path) -> None:
    _add_methods(textlm, "    def predict(self, model, batch):\n        return 3\n")
    refused(textlm, tmp_path, "textlm:CharLM", "predict()", "list of dicts")


def test_a_score_that_fails_on_the_selection_split_only_is_refused(
    textlm: Path, tmp_path: Path
) -> None:
    """score runs on one batch of each split the verdict reads (report, then selection), as
    the close calls it; here its second call, on the selection split, fails."""
    path = textlm.parent / "textlm.py"
    marker = "        loss = per_byte.mean(dim=1)\n"
    assert marker in path.read_text()
    path.write_text(
        path.read_text().replace(
            marker,
            marker + "        self.calls = getattr(self, 'calls', 0) + 1\n"
            "        if self.calls == 2:\n"
            "            raise RuntimeError('cannot score this split')\n",
        )
    )
    text = refused(textlm, tmp_path, "textlm:CharLM", "score()", "cannot score this split")
    assert "'val' split" in text


def test_a_recipe_file_that_links_out_of_the_spec_folder(textlm: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (textlm.parent / "textlm.py").rename(outside / "textlm.py")
    (textlm.parent / "textlm.py").symlink_to(outside / "textlm.py")
    text = refused(textlm, tmp_path, "textlm:CharLM", "textlm.py", "link out of the spec's folder")
    assert str(outside / "textlm.py") in text


# --- the pins --------------------------------------------------------------------------------
def test_a_wrong_corpus_sha256_names_both_hashes_and_campaign_pin(
    digits: Path, tmp_path: Path
) -> None:
    actual = input_sha256(digits.parent / "data" / "digits.csv")
    typo = actual[:-4] + ("0000" if not actual.endswith("0000") else "1111")
    edit(digits, lambda d: d["corpus"].update(sha256=typo))
    text = refused(digits, tmp_path, "corpus.sha256", "data/digits.csv", actual, typo)
    assert "campaign pin" in text and str(digits.parent / "data" / "digits.csv") in text
    # The command it names prints the right pin.
    command = text.split("`campaign pin ")[1].split("`")[0]
    assert campaign("pin", command) == (0, actual)


def test_a_wrong_input_sha256_is_named(textlm: Path, tmp_path: Path) -> None:
    (textlm.parent / "base.bin").write_bytes(b"weights")
    edit(textlm, lambda d: d.update(inputs={"base": {"path": "base.bin", "sha256": "f" * 64}}))
    refused(textlm, tmp_path, "inputs.base.sha256", "base.bin", "f" * 64, "campaign pin")


def test_a_corpus_path_that_links_out_of_the_folder(digits: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.csv"
    (digits.parent / "data" / "digits.csv").rename(outside)
    (digits.parent / "data" / "digits.csv").symlink_to(outside)
    refused(digits, tmp_path, "corpus.path", "data/digits.csv", "outside")


def test_a_folder_corpus_with_a_link_out_of_it(textlm: Path, tmp_path: Path) -> None:
    docs = textlm.parent / "docs"
    docs.mkdir()
    (textlm.parent / "data" / "sklearn-docs.txt").rename(docs / "a.txt")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the corpus\n")
    # Pinned first, then a link planted in the pinned folder.
    edit(textlm, lambda d: d["corpus"].update(path="docs", sha256=input_sha256(docs)))
    (docs / "b.txt").symlink_to(secret)
    refused(textlm, tmp_path, "corpus.path", "docs/b.txt", "is a link", str(secret))


def test_a_pinned_folder_given_to_the_builtin_mlp_is_named_as_such(
    digits: Path, tmp_path: Path
) -> None:
    """The folder is there: the built-in reads a CSV table (not "corpus file 'data' is
    missing")."""
    data = digits.parent / "data"
    edit(digits, lambda d: d["corpus"].update(path="data", sha256=input_sha256(data)))
    text = refused(digits, tmp_path, "corpus.path", "'data' is a folder", "mlp", "CSV table")
    assert "missing" not in text


# --- the corpus table ------------------------------------------------------------------------
def test_an_empty_corpus(digits: Path, tmp_path: Path) -> None:
    (digits.parent / "data" / "digits.csv").write_bytes(b"")
    repin(digits)
    refused(digits, tmp_path, "corpus.path", "data/digits.csv", "is empty")


def test_a_table_with_a_header_and_no_rows(digits: Path, tmp_path: Path) -> None:
    path = digits.parent / "data" / "digits.csv"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    repin(digits)
    refused(digits, tmp_path, "corpus", "data/digits.csv", "'train' is empty")


def test_a_table_without_its_label_column(digits: Path, tmp_path: Path) -> None:
    path = digits.parent / "data" / "digits.csv"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace("label", "target")
    path.write_text("\n".join(lines) + "\n")
    repin(digits)
    refused(digits, tmp_path, "corpus", "data/digits.csv", "['label'] not found")


# --- numbers that are not numbers ------------------------------------------------------------
NOT_NUMBERS = {
    "decision_rule.threshold": (lambda d: d["decision_rule"].update(threshold=float("nan"))),
    "decision_rule.min_gain": (lambda d: d["decision_rule"].update(min_gain=float("inf"))),
    "control.lr": (lambda d: d["control"].update(lr=float("inf"))),
    "control.hidden[0]": (lambda d: d["control"].update(hidden=[-1])),
    "gpu_lock.timeout_s": (lambda d: d.update(gpu_lock={"timeout_s": float("inf")})),
    "packages[0].price_usd": (lambda d: d["packages"][0].update(price_usd=float("inf"))),
    "people": (lambda d: d.update(people=2**63)),
    "control.batch_size": (lambda d: d["control"].update(batch_size=2**63)),
    "control.epochs": (lambda d: d["control"].update(epochs=2**63)),
    "control.threads": (lambda d: d["control"].update(threads=2**63)),
    "control.max_steps": (lambda d: d["control"].update(max_steps=2**63)),
    "checkpoint.keep": (lambda d: d.update(checkpoint={"keep": 2**63})),
    "checkpoint.interruption_hours": (
        lambda d: d.update(checkpoint={"interruption_hours": float("inf")})
    ),
    "calendar[0].hours": (lambda d: d["calendar"][0].update(hours=float("inf"))),
}


@pytest.mark.parametrize("field", sorted(NOT_NUMBERS))
def test_a_number_that_is_not_a_number_is_refused(digits: Path, tmp_path: Path, field: str):
    edit(digits, NOT_NUMBERS[field])
    text = refused(digits, tmp_path, f"field '{field}'")
    assert "finite number" in text or "less than or equal to" in text or "greater than" in text


def test_a_limit_is_named_and_a_value_at_it_is_accepted(digits: Path, tmp_path: Path) -> None:
    from gpucampaign.config import load_spec
    from gpucampaign.config.parts import MAX_BATCH_SIZE

    edit(digits, lambda d: d["control"].update(batch_size=MAX_BATCH_SIZE + 1))
    refused(digits, tmp_path, "control.batch_size", str(MAX_BATCH_SIZE))
    edit(digits, lambda d: d["control"].update(batch_size=MAX_BATCH_SIZE))
    assert load_spec(digits).control.batch_size == MAX_BATCH_SIZE


def test_an_alias_bomb_is_refused_at_once(digits: Path, tmp_path: Path) -> None:
    lines = ["    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    # A million values in seven lines (each more level multiplies by ten: nine of them
    # exhaust the memory of the machine running the test when aliases are followed).
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 6)]
    text = digits.read_text().replace("control:\n", "control:\n  args:\n" + "\n".join(lines) + "\n")
    digits.write_text(text)
    started = time.monotonic()
    refused(digits, tmp_path, "not valid YAML", "alias '*l0'", "line")
    assert time.monotonic() - started < 10


def test_an_oversize_spec_is_refused_before_it_is_read(digits: Path, tmp_path: Path) -> None:
    with digits.open("a") as f:
        f.write(("# padding\n" * 10) * 600_000)
    assert digits.stat().st_size > 50_000_000
    started = time.monotonic()
    refused(digits, tmp_path, str(digits), "bytes, more than the 1000000 bytes")
    assert time.monotonic() - started < 10


# --- what plan says it checked -----------------------------------------------------------------
def test_plan_prints_what_it_checked(textlm: Path) -> None:
    code, text = campaign("plan", str(textlm))
    assert code in (0, 4), text
    for said in (
        "checked: spec 'textlm'",
        "recipe file of 'textlm:CharLM': textlm.py",
        "corpus 'data/sklearn-docs.txt': file of",
        "sha256 as pinned",
        "evaluate returns 'loss', score on test and val",
        "storage local",
    ):
        assert said in text, (said, text)
    result = CliRunner().invoke(app, ["plan", str(textlm), "--json"])
    checked = json.loads(result.stdout)["preflight"]["checked"]
    assert any("textlm:CharLM" in line for line in checked)


def test_the_preflight_writes_nothing(digits: Path) -> None:
    """The spec's folder holds the same files, byte for byte, after a plan."""

    def files() -> dict[str, str]:
        return {
            p.relative_to(digits.parent).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(digits.parent.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }

    before = files()
    assert campaign("plan", str(digits))[0] in (0, 4)
    assert files() == before


# --- the deployment flow -----------------------------------------------------------------------
@pytest.mark.slow
def test_the_deployment_flow_refuses_before_the_audit(
    prefect_harness, textlm: Path, tmp_path: Path
) -> None:
    from gpucampaign_prefect.flows.campaign import campaign as campaign_flow

    edit(textlm, lambda d: d["decision_rule"].update(metric="perplexity"))
    out = tmp_path / "deployed"
    state = campaign_flow(spec=str(textlm), out=str(out), return_state=True)
    assert state.is_failed() and "did not return 'perplexity'" in state.message
    assert "refused before anything started" in state.message
    assert not out.exists()


# --- the GPU lock's slots ----------------------------------------------------------------------
def test_a_run_wider_than_any_lot_is_refused_before_prefect_starts(
    digits: Path, tmp_path: Path
) -> None:
    """A variant asking 4 GPUs on 1-GPU lots would wait for 4 slots the lock never grants; it
    is not on the calendar, so only the preflight can refuse it (exit 2, no output folder)."""
    edit(
        digits,
        lambda d: d["variants"].append(
            {"name": "wide", "tier": "exploratory", "changes": {"gpus": 4}}
        ),
    )
    text = refused(digits, tmp_path, "variants.wide.changes.gpus", "gpus: 4", "rtx4090")
    assert "ONE machine" in text and "have at most 1 each" in text
