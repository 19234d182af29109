"""`campaign verify` names each defect of an output folder and passes a clean one (R15)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.verify.checks import (
    CHECKS,
    check_corpus,
    check_empty_files,
    check_escaping_paths,
    check_expected_runs,
    check_json,
    check_links,
    check_manifest_files,
    check_manifest_readable,
    check_models_reload,
    check_plan_hash,
    check_spec,
    check_temp_paths,
    verify_output,
)
from gpucampaign.verify.context import VerifyContext
from tests.helpers import reseal


def _run_dir(out: Path, closed: dict, run: str = "control") -> Path:
    return out / "runs" / closed["run_ids"][run]


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))


@pytest.mark.process
def test_clean_folder_is_verified_with_every_model_reloaded(out: Path, closed: dict):
    report = verify_output(out)
    assert report.problems == []
    assert report.verified
    assert sorted(report.reloaded_runs) == sorted(closed["run_ids"].values())
    assert report.checked_files >= 20


@pytest.mark.process
def test_cli_verify_exit_codes(out: Path, closed: dict):
    ok = CliRunner().invoke(app, ["verify", str(out), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["verified"] is True
    (_run_dir(out, closed) / "metrics.jsonl").write_text("")
    bad = CliRunner().invoke(app, ["verify", str(out)])
    assert bad.exit_code == 4
    assert "empty_file" in bad.output and "metrics.jsonl" in bad.output


def test_emptied_file(out: Path, closed: dict):
    target = _run_dir(out, closed) / "metrics.jsonl"
    target.write_text("")
    reseal(out)  # even with a manifest that agrees, an empty file is not an output
    report = verify_output(out, reload=False)
    assert not report.verified
    assert [(p.code, p.path) for p in report.problems] == [
        ("empty_file", target.relative_to(out).as_posix())
    ]


def test_predictions_without_rows(out: Path, closed: dict):
    (_run_dir(out, closed) / "predictions.csv").write_text("id,label,prediction,confidence\n")
    reseal(out)
    assert "empty_file" in verify_output(out, reload=False).codes()


@pytest.mark.parametrize(
    ("change", "code", "named"),
    [
        ({"checkpoint_dir": "/tmp/gpucampaign-x/ckpt"}, "temp_path", "/tmp/gpucampaign-x"),
        ({"corpus_path": "../../elsewhere/corpus.csv"}, "escaping_path", "corpus_path"),
    ],
    ids=["temp_path", "path_escaping_the_folder"],
)
def test_a_path_in_params_outside_the_folder(out: Path, closed: dict, change, code, named):
    _edit_json(_run_dir(out, closed) / "params.json", **change)
    reseal(out)
    report = verify_output(out, reload=False)
    assert report.codes() == {code}
    assert named in report.problems[0].detail


def test_missing_run_id(out: Path, closed: dict):
    shutil.rmtree(_run_dir(out, closed, "wide"))
    reseal(out)
    report = verify_output(out, reload=False)
    # Its evidence gone, the sealed verdict no longer follows from the folder either.
    assert report.codes() == {"missing_run", "verdict_mismatch"}
    assert closed["run_ids"]["wide"] in report.problems[0].path


def test_run_dropped_from_the_manifest_is_still_expected_from_the_spec(out: Path, closed: dict):
    m = json.loads((out / "manifest.json").read_text())
    del m["runs"][closed["run_ids"]["wide"]]
    (out / "manifest.json").write_text(json.dumps(m))
    report = verify_output(out, reload=False)
    assert report.codes() == {"missing_run"}


def test_missing_file_of_a_completed_run(out: Path, closed: dict):
    (_run_dir(out, closed) / "error_analysis.json").unlink()
    reseal(out)
    report = verify_output(out, reload=False)
    assert report.codes() == {"missing_file"}


def test_tampered_file(out: Path):
    md = out / "report.md"
    md.write_text(md.read_text().replace("Verdict", "Verdicт"))
    report = verify_output(out, reload=False)
    assert {(p.code, p.path) for p in report.problems} == {("size_mismatch", "report.md")}
    data = bytearray((out / "figures/curves.png").read_bytes())
    data[-20] ^= 0xFF  # same size, different bytes
    (out / "figures/curves.png").write_bytes(bytes(data))
    codes = {(p.code, p.path) for p in verify_output(out, reload=False).problems}
    assert ("hash_mismatch", "figures/curves.png") in codes


def test_files_added_or_removed_after_the_manifest(out: Path):
    (out / "notes.txt").write_text("added later")
    (out / "figures/calendar.png").unlink()
    codes = {(p.code, p.path) for p in verify_output(out, reload=False).problems}
    assert codes == {("unlisted_file", "notes.txt"), ("missing_file", "figures/calendar.png")}


def test_edited_plan(out: Path):
    plan = json.loads((out / "plan.json").read_text())
    plan["steps"][0]["hours"] += 10
    (out / "plan.json").write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")
    reseal(out)  # a manifest rebuilt afterwards does not hide it: plan.sha256 is from the start
    report = verify_output(out, reload=False)
    assert report.codes() == {"plan_changed"}


@pytest.mark.process
def test_model_that_no_longer_reloads(out: Path, closed: dict):
    weights = _run_dir(out, closed) / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    reseal(out)  # the listing agrees with the files, but the file is not a model any more
    report = verify_output(out)
    assert report.codes() == {"reload_failed"}
    assert report.reloaded_runs == [closed["run_ids"]["wide"]]


@pytest.mark.process
def test_predictions_the_model_does_not_reproduce(out: Path, closed: dict):
    path = _run_dir(out, closed, "wide") / "predictions.csv"
    lines = path.read_text().splitlines()
    row = lines[1].split(",")
    row[3] = repr(float(row[3]) + 1e-9)
    lines[1] = ",".join(row)
    path.write_text("\n".join(lines) + "\n")
    reseal(out)
    report = verify_output(out)
    assert report.codes() == {"predictions_mismatch"}
    assert row[0] in report.problems[0].detail


def test_stop_id_not_in_stops(out: Path, closed: dict):
    m = json.loads((out / "manifest.json").read_text())
    m["runs"][closed["run_ids"]["wide"]].update(status="stopped", stop_id="stop-000000000000")
    (out / "manifest.json").write_text(json.dumps(m))
    assert verify_output(out, reload=False).codes() == {"unknown_stop"}


def test_altered_corpus_copy(out: Path):
    corpus = out / "data" / "corpus.csv"
    corpus.write_text(corpus.read_text().replace("r001", "r999"))
    reseal(out)
    assert verify_output(out, reload=False).codes() == {"corpus_mismatch"}


def test_no_manifest(out: Path):
    (out / "manifest.json").unlink()
    report = verify_output(out, reload=False)
    assert "missing_manifest" in report.codes() and not report.verified


@pytest.mark.process
def test_external_corpus_is_checked_by_hash_and_models_reload_from_it(
    out: Path, closed: dict, tmp_path: Path
):
    from gpucampaign.close.manifest import reference_corpus

    copy = out / "data" / "corpus.csv"
    elsewhere = tmp_path / "big" / "corpus.csv"
    elsewhere.parent.mkdir()
    shutil.move(copy, elsewhere)
    m = json.loads((out / "manifest.json").read_text())
    m["corpus"] = reference_corpus(out, elsewhere, copy_limit_bytes=10)
    (out / "manifest.json").write_text(json.dumps(m))
    reseal(out)
    report = verify_output(out)
    # The models reload from the external file; its location, in a temporary folder here, is named.
    assert report.codes() == {"temp_path"} and report.problems[0].path == "manifest.json"
    assert len(report.reloaded_runs) == 2
    elsewhere.write_text(elsewhere.read_text() + "\n")
    assert "corpus_mismatch" in verify_output(out, reload=False).codes()


def test_reload_check_with_a_loaded_corpus_before_any_manifest(out: Path, closed: dict):
    """The close task checks deliveries before the manifest exists: it passes the corpus itself."""
    from gpucampaign.close.predictions import reload_check
    from gpucampaign.config import load_spec
    from gpucampaign.data.corpus import load_corpus
    from gpucampaign.folder.layout import corpus_file

    ref = json.loads((out / "manifest.json").read_text())["corpus"]
    corpus = load_corpus(corpus_file(out, ref), corpus_spec=load_spec(out / "spec.yaml").corpus)
    (out / "manifest.json").unlink()
    rid = closed["run_ids"]["wide"]
    assert reload_check(out, [rid], corpus=corpus)[rid]["ok"] is True
    path = out / "runs" / rid / "predictions.csv"
    lines = path.read_text().splitlines()
    row = lines[1].split(",")
    row[3] = repr(float(row[3]) + 1e-9)
    lines[1] = ",".join(row)
    path.write_text("\n".join(lines) + "\n")
    found = reload_check(out, [rid], corpus=corpus)[rid]
    assert (
        found["ok"] is False
        and found["mismatches"] == 1
        and found["first_mismatch"]["id"] == row[0]
    )


# --- one check at a time ----------------------------------------------------------------------
def _emptied(out: Path, closed: dict) -> str:
    target = _run_dir(out, closed) / "metrics.jsonl"
    target.write_text("")
    return target.relative_to(out).as_posix()


def _temp_param(out: Path, closed: dict) -> str:
    _edit_json(_run_dir(out, closed) / "params.json", checkpoint_dir="/tmp/gpucampaign-x/ckpt")
    return (_run_dir(out, closed) / "params.json").relative_to(out).as_posix()


def _escaping_link(out: Path, closed: dict) -> str:
    md = out / "report.md"
    md.write_text(md.read_text() + "\nSee [the notes](../../notes/secret.md).\n")
    return "report.md"


def _broken_json(out: Path, closed: dict) -> str:
    params = _run_dir(out, closed) / "params.json"
    params.write_text(params.read_text()[:-5])
    return params.relative_to(out).as_posix()


def _link_out(out: Path, closed: dict, tmp_path: Path) -> str:
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    params = _run_dir(out, closed) / "params.json"
    params.unlink()
    params.symlink_to(outside)
    return params.relative_to(out).as_posix()


def _added_file(out: Path, closed: dict) -> str:
    (out / "notes.txt").write_text("added later")
    return "notes.txt"


def _edited_plan(out: Path, closed: dict) -> str:
    plan = json.loads((out / "plan.json").read_text())
    plan["steps"][0]["hours"] += 10
    (out / "plan.json").write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")
    return "plan.json"


def _edited_spec(out: Path, closed: dict) -> str:
    spec = out / "spec.yaml"
    spec.write_text(spec.read_text().replace("closing-test", "closing-test-2", 1))
    return "spec.yaml"


def _unknown_stop(out: Path, closed: dict) -> str:
    m = json.loads((out / "manifest.json").read_text())
    m["runs"][closed["run_ids"]["wide"]].update(status="stopped", stop_id="stop-000000000000")
    (out / "manifest.json").write_text(json.dumps(m))
    return f"runs/{closed['run_ids']['wide']}"


def _altered_corpus(out: Path, closed: dict) -> str:
    corpus = out / "data" / "corpus.csv"
    corpus.write_text(corpus.read_text().replace("r001", "r999"))
    return "data/corpus.csv"


def _garbled_manifest(out: Path, closed: dict) -> str:
    (out / "manifest.json").write_text('{"files": 3}')
    return "manifest.json"


BREAKS = [
    (check_empty_files, _emptied, "empty_file"),
    (check_temp_paths, _temp_param, "temp_path"),
    (check_escaping_paths, _escaping_link, "escaping_path"),
    (check_json, _broken_json, "invalid_json"),
    (check_links, _link_out, "escaping_path"),
    (check_manifest_files, _added_file, "unlisted_file"),
    (check_plan_hash, _edited_plan, "plan_changed"),
    (check_spec, _edited_spec, "spec_changed"),
    (check_expected_runs, _unknown_stop, "unknown_stop"),
    (check_corpus, _altered_corpus, "corpus_mismatch"),
    (check_manifest_readable, _garbled_manifest, "invalid_manifest"),
]


@pytest.mark.parametrize(
    "check",
    [  # the reload check reloads the models in a fresh process
        pytest.param(c, marks=pytest.mark.process) if c is check_models_reload else c
        for c in CHECKS
    ],
    ids=lambda c: c.__name__,
)
def test_each_check_finds_nothing_in_a_clean_folder(out: Path, closed: dict, check):
    ctx = VerifyContext.open(out, reload=check is check_models_reload)
    assert check(ctx) == []
    if check is check_models_reload:
        assert sorted(ctx.reloaded) == sorted(closed["run_ids"].values())


@pytest.mark.parametrize(
    ("check", "damage", "code"), BREAKS, ids=[c.__name__ for c, _, _ in BREAKS]
)
def test_each_check_names_the_one_defect_it_owns(
    out: Path, closed: dict, tmp_path: Path, check, damage, code
):
    args = (out, closed, tmp_path) if damage is _link_out else (out, closed)
    path = damage(*args)
    found = [(p.code, p.path) for p in check(VerifyContext.open(out, reload=False))]
    assert found == [(code, path)]


def test_checks_leave_a_defect_they_do_not_own_to_its_check(out: Path, closed: dict):
    """An emptied file is only named by check_empty_files, not also as broken JSON or a path."""
    _emptied(out, closed)
    ctx = VerifyContext.open(out, reload=False)
    for check in (check_json, check_temp_paths, check_escaping_paths, check_links):
        assert check(ctx) == [], check.__name__
    assert [p.code for p in check_manifest_files(ctx)] == ["size_mismatch"]


@pytest.mark.process
def test_a_reload_that_fails_is_named_by_the_reload_check(out: Path, closed: dict):
    weights = _run_dir(out, closed) / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    ctx = VerifyContext.open(out)
    found = [(p.code, p.path) for p in check_models_reload(ctx)]
    assert found == [("reload_failed", f"runs/{closed['run_ids']['control']}/model")]
    assert ctx.reloaded == [closed["run_ids"]["wide"]]
    assert check_models_reload(VerifyContext.open(out, reload=False)) == []


def test_fresh_process_entry_point_checks_and_predicts_again(out: Path, closed: dict, capsys):
    import torch

    from gpucampaign.close.predictions import main

    rid = closed["run_ids"]["wide"]
    threads = torch.get_num_threads()  # a reload sets the run's thread count in this process
    try:
        assert main(["reload-check", str(out), rid]) == 0
        assert capsys.readouterr().out == f"{rid}: {_row_count(out, rid)} rows reproduced\n"
        again = out.parent / "again.csv"
        assert main(["predict", str(out), rid, "--to", str(again)]) == 0
        assert again.read_bytes() == (out / "runs" / rid / "predictions.csv").read_bytes()
        assert main(["reload-check", str(out.parent / "nowhere")]) == 2
    finally:
        torch.set_num_threads(threads)


def _row_count(out: Path, rid: str) -> int:
    return len((out / "runs" / rid / "predictions.csv").read_text().splitlines()) - 1


def test_seal_problems_read_bytes_only_and_name_each_changed_file(out: Path, closed: dict):
    """What `campaign retrieve` checks before anything of a retrieved folder is trusted."""
    from gpucampaign.verify.checks import seal_problems

    assert seal_problems(out) == []
    weights = _run_dir(out, closed) / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4] ^= 0xFF
    weights.write_bytes(bytes(data))
    (out / "notes.txt").write_text("added")
    found = {(p.code, p.path) for p in seal_problems(out)}
    assert found == {
        ("hash_mismatch", weights.relative_to(out).as_posix()),
        ("unlisted_file", "notes.txt"),
    }


def test_the_reload_entry_point_refuses_a_run_whose_files_are_not_the_sealed_ones(
    out: Path, closed: dict
):
    """`python -m gpucampaign.predictions reload-check` (RELOAD.md) checks the run's files
    against the manifest before it imports or reads anything of them."""
    from gpucampaign.close.predictions import reload_check

    rid = closed["run_ids"]["control"]
    (out / "runs" / rid / "model" / "recipe").mkdir()
    (out / "runs" / rid / "model" / "recipe" / "planted.py").write_text("raise SystemExit(9)\n")
    found = reload_check(out, [rid])[rid]
    assert found["ok"] is False and "planted.py" in found["error"]
    assert found["error"].startswith("not reloaded")


# --- the anchor and report.md, each alone and fast (no model reloaded) ------------------------
# Two checks of ``verify`` each shown alone, without reloading a model (fast): ``--expect``
# compares the manifest's sha256 (another one is refused and never anchors), and ``report.md``
# must say the recomputed verdict's answer and text where a reader sees them (a forged headline
# with the true text hidden in a comment fails).


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_expect_compares_the_manifests_sha256(out: Path) -> None:
    sealed = _sha256(out / "manifest.json")
    other = verify_output(out, reload=False, expect="0" * 64)
    assert not other.verified and other.anchored is False and not other.folder_code_trusted
    assert [p.code for p in other.problems] == ["manifest_not_anchored"]
    assert sealed in other.problems[0].detail
    same = verify_output(out, reload=False, expect=sealed.upper())
    assert same.verified and same.anchored is True, same.problems


def _verdict(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["verdict"]


def test_a_report_md_that_does_not_say_the_verdict_fails(out: Path) -> None:
    assert verify_output(out, reload=False).verified
    md = (out / "report.md").read_text()
    answer = _verdict(out)["answer"]
    assert answer in md
    (out / "report.md").write_text(md.replace(answer, "Yes: adopt the variant"))
    reseal(out)
    got = verify_output(out, reload=False)
    assert not got.verified
    assert [(p.code, p.path) for p in got.problems] == [("verdict_mismatch", "report.md")]


def test_the_true_verdict_hidden_in_a_comment_does_not_count(out: Path) -> None:
    md = (out / "report.md").read_text()
    verdict = _verdict(out)
    hidden = f"<!-- {verdict['answer']} {verdict['text']} -->\n"
    forged = md.replace(verdict["answer"], "Yes: adopt the variant").replace(verdict["text"], "")
    (out / "report.md").write_text(hidden + forged)
    reseal(out)
    got = verify_output(out, reload=False)
    assert not got.verified
    assert [(p.code, p.path) for p in got.problems] == [("verdict_mismatch", "report.md")]


FORGED = "Yes-adopt-FORGED-HEADLINE"


def test_a_forged_headline_above_the_true_one_fails(out: Path) -> None:
    """The true answer and text stay where a reader sees them; a headline added above them is
    still a forgery: report.md must be what the recomputed verdict renders, byte for byte."""
    md = (out / "report.md").read_text()
    title, rest = md.split("\n", 1)
    (out / "report.md").write_text(f"{title}\n\n**Answer:** {FORGED}\n{rest}")
    reseal(out)
    got = verify_output(out, reload=False)
    assert not got.verified
    assert [(p.code, p.path) for p in got.problems] == [("verdict_mismatch", "report.md")]
    assert FORGED in got.problems[0].detail and "line 3" in got.problems[0].detail


def test_a_forged_report_html_fails(out: Path) -> None:
    page = (out / "report.html").read_text()
    assert "<body>" in page
    (out / "report.html").write_text(page.replace("<body>", f"<body><h1>{FORGED}</h1>", 1))
    reseal(out)
    got = verify_output(out, reload=False)
    assert not got.verified
    assert [(p.code, p.path) for p in got.problems] == [("verdict_mismatch", "report.html")]
    code = CliRunner().invoke(app, ["verify", str(out)])
    assert code.exit_code == 4 and "report.html" in code.output, code.output


def test_campaign_report_never_prints_a_forged_headline(out: Path) -> None:
    """`campaign report` generates the report now from report.json with the verdict recomputed
    from the folder's records: neither a forged report.md nor a forged report.json verdict (its
    manifest re-hashed) is shown as the answer."""
    md = (out / "report.md").read_text()
    (out / "report.md").write_text(md.replace("**Answer:**", f"**Answer:** {FORGED}", 1))
    reseal(out)
    shown = CliRunner().invoke(app, ["report", str(out)])
    assert shown.exit_code == 0, shown.output
    assert FORGED not in shown.output and "Answer:" in shown.output
    report = json.loads((out / "report.json").read_text())
    true_answer = report["verdict"]["answer"]
    report["verdict"]["answer"] = FORGED
    (out / "report.json").write_text(json.dumps(report))
    reseal(out)
    shown = CliRunner().invoke(app, ["report", str(out)])
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.output.split())
    # Named once, in the warning above the report; the report's answer is the recomputed one.
    assert flat.count(FORGED) == 1 and FORGED not in flat.split("Answer:", 1)[1]
    assert "differs from the one the folder's records give" in flat
    as_json = json.loads(CliRunner().invoke(app, ["report", str(out), "--json"]).output)
    assert as_json["verdict"]["answer"] == true_answer and "warning" in as_json


# --- the folder does not choose which installed code runs ------------------------------------
# The folder does not choose which installed code runs: a recipe is resolved to a file and
# hashed before anything is imported; no recorded sha256 means nothing is trusted; a package's
# ``__main__`` or a file without the recipe's class is never imported; a dotted name's package
# is not run before its file's hash is checked.


def _name(out: Path, closed: dict, recipe: str, sha: str | None) -> None:
    """The attack: the control's model names ``recipe`` (with ``sha`` as its recorded
    sha256, or none), the manifest re-hashed to match."""
    cfg_path = out / "runs" / closed["run_ids"]["control"] / "model" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["recipe"] = cfg["run_config"]["recipe"] = recipe
    cfg.pop("recipe_sha256", None)
    if sha is not None:
        cfg["recipe_sha256"] = sha
    cfg_path.write_text(json.dumps(cfg, indent=2))
    reseal(out)


def _predict_cli(out: Path, *args: str) -> tuple[int, str]:
    got = CliRunner().invoke(app, ["predict", str(out), "control", *args])
    return got.exit_code, " ".join(got.output.split())


def _venv_main_sha() -> str:
    import importlib.util

    found = importlib.util.find_spec("venv")
    assert found is not None and found.origin
    return hashlib.sha256((Path(found.origin).parent / "__main__.py").read_bytes()).hexdigest()


@pytest.mark.parametrize("trust", [False, True], ids=["untrusted", "trust-folder-code"])
def test_no_recorded_sha256_trusts_nothing(out: Path, closed: dict, monkeypatch, trust) -> None:
    """``venv.__main__:X`` with no ``recipe_sha256``: refused in one paragraph naming the
    field, exit 2, and ``venv`` never imported."""
    for name in [m for m in sys.modules if m == "venv" or m.startswith("venv.")]:
        monkeypatch.delitem(sys.modules, name)
    _name(out, closed, "venv.__main__:X", None)
    code, text = _predict_cli(out, *(["--trust-folder-code"] if trust else []))
    assert code == 2, text
    assert "recipe_sha256" in text and "Traceback" not in text
    assert "venv" not in sys.modules and "venv.__main__" not in sys.modules


def test_a_packages_main_with_its_own_sha256_is_never_imported(
    out: Path, closed: dict, monkeypatch
) -> None:
    """The folder records the real sha256 of ``venv/__main__.py`` (anyone can compute it): the
    file matches, and is still refused before it is imported."""
    for name in [m for m in sys.modules if m == "venv" or m.startswith("venv.")]:
        monkeypatch.delitem(sys.modules, name)
    _name(out, closed, "venv.__main__:X", _venv_main_sha())
    code, text = _predict_cli(out)
    assert code == 2, text
    assert "__main__" in text and "Traceback" not in text
    assert "venv" not in sys.modules and "venv.__main__" not in sys.modules


def test_a_dotted_recipe_name_runs_no_package_before_its_hash_is_checked(
    out: Path, closed: dict, tmp_path: Path, monkeypatch
) -> None:
    """``--recipes DIR`` holding a package whose ``__init__`` has a side effect, and a module
    of another sha256 than recorded: refused as not trusted, the package never run."""
    pkg_name = "sideeffect_pkg_46"
    recipes = tmp_path / "recipes"
    (recipes / pkg_name).mkdir(parents=True)
    marker = tmp_path / "package-ran"
    (recipes / pkg_name / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (recipes / pkg_name / "mod.py").write_text(
        "from gpucampaign.builtin.tabular import MLP as Planted\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    _name(out, closed, f"{pkg_name}.mod:Planted", "0" * 64)
    code, text = _predict_cli(out, "--recipes", str(recipes))
    assert not marker.exists(), text
    assert code == 2 and "another sha256" in text, text
    sys.modules.pop(pkg_name, None)


def test_a_file_without_the_recipes_class_is_never_imported(
    out: Path, closed: dict, tmp_path: Path, monkeypatch
) -> None:
    """The user's own helper script in ``--recipes DIR``, named with its real sha256 and a class
    it does not define: refused before it runs."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    marker = tmp_path / "helper-ran"
    helper = recipes / "my_helper_46.py"
    helper.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    _name(out, closed, "my_helper_46:Anything", hashlib.sha256(helper.read_bytes()).hexdigest())
    code, text = _predict_cli(out, "--recipes", str(recipes))
    assert not marker.exists(), text
    assert code == 2 and "defines no class 'Anything'" in text, text
