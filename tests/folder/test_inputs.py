"""The output folder is self-contained: the files the spec names are copied in, so the
scheduled restart check, `campaign report` and `campaign verify` work on a moved copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.close.manifest import keep_inputs
from gpucampaign.config import CampaignSpec, SpecError, load_spec
from gpucampaign.data.corpus import load_corpus
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import INPUTS, OutputFolder, RunFolder
from gpucampaign.plan import calendar
from gpucampaign.plan.tariffs import load_catalog
from gpucampaign.restartcheck.scheduled import output_check_target
from gpucampaign.storage import LocalStore
from tests.helpers import TINY, build_closed_folder, digits_file  # noqa: F401  (a pytest fixture)

CATALOG = "provider: MyCloud\nlots:\n  - {gpu: h100, days: 3, gpus: 1, price_usd: 99.5}\n"


def _campaign(src: Path, digits: tuple[Path, str]) -> Path:
    (src / "data").mkdir(parents=True)
    shutil.copyfile(digits[0], src / "data" / "digits.csv")
    (src / "prices").mkdir()
    (src / "prices" / "mycatalog.yaml").write_text(CATALOG)
    spec = {
        "name": "moved",
        "catalog": "prices/mycatalog.yaml",
        "packages": [{"gpu": "h100", "days": 3}],
        "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
        "corpus": {"path": "data/digits.csv", "sha256": digits[1]},
        "control": {**TINY, "max_steps": 4},
        "decision_rule": {"metric": "accuracy", "threshold": 0.0},
    }
    (src / "campaign.yaml").write_text(yaml.safe_dump(spec))
    return src / "campaign.yaml"


def _pin_base_model(spec_file: Path, rel: str) -> Path:
    """Write a small base model at ``rel`` beside the spec and pin it as input ``base``."""
    from gpucampaign.core.files import sha256_file

    base = spec_file.parent / rel
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_bytes(b"weights of an earlier campaign")
    data = yaml.safe_load(spec_file.read_text())
    data["inputs"] = {"base": {"path": rel, "sha256": sha256_file(base)}}
    spec_file.write_text(yaml.safe_dump(data))
    return base


def _train_control(spec: CampaignSpec, *, src: Path, out: Path, **kw: Any) -> str:
    """Train the control of the campaign in ``src`` into the output folder ``out``; its run ID."""
    corpus = load_corpus(src / spec.corpus.path, corpus_spec=spec.corpus)
    run = spec.resolve_run("control")
    store = LocalStore(out / "checkpoints")
    train_run(
        spec, run=run, corpus=corpus, store=store, run_folder=RunFolder.of(out, run.run_id), **kw
    )
    return run.run_id


def test_a_moved_folder_resolves_its_catalog_and_corpus_for_the_scheduled_check(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
) -> None:
    spec_file = _campaign(tmp_path / "src", digits_file)
    spec = load_spec(spec_file)
    out = tmp_path / "out"
    folder = OutputFolder(out)
    folder.keep_spec(spec_file.read_bytes(), source="test")
    kept = keep_inputs(out, spec, base_dir=spec_file.parent)  # what the flow does at its start
    assert kept["catalog"]["path"] == "prices/mycatalog.yaml"
    assert kept["corpus"]["kind"] == "copied"
    assert json.loads((out / INPUTS).read_text()) == kept
    rid = _train_control(spec, src=spec_file.parent, out=out)

    moved = tmp_path / "elsewhere" / "out"
    shutil.copytree(out, moved)
    shutil.rmtree(tmp_path / "src")
    shutil.rmtree(out)
    target = output_check_target(moved)
    assert target.runs == {"control": rid}
    assert moved in target.corpus_path.parents
    cat = load_catalog(spec=target.spec, base_dir=moved)
    assert calendar.plan(target.spec, catalog=cat).total_price_usd == cat.find("h100", 3).price_usd


def test_a_catalog_path_on_a_record_name_is_refused(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
) -> None:
    spec_file = _campaign(tmp_path / "src", digits_file)
    (spec_file.parent / "runs").mkdir()
    shutil.copyfile(
        spec_file.parent / "prices" / "mycatalog.yaml", spec_file.parent / "runs" / "c.yaml"
    )
    text = spec_file.read_text().replace("prices/mycatalog.yaml", "runs/c.yaml")
    spec_file.write_text(text)
    with pytest.raises(SpecError, match="name the output folder uses"):
        keep_inputs(tmp_path / "out", load_spec(spec_file), base_dir=spec_file.parent)


@pytest.mark.process  # verify reloads the models in a fresh process
def test_report_and_verify_work_on_a_closed_folder_moved_without_its_spec_folder(
    tmp_path: Path,
) -> None:
    built = build_closed_folder(tmp_path / "a")
    moved = tmp_path / "b" / "out"
    shutil.copytree(built["out"], moved)
    shutil.rmtree(tmp_path / "a")
    res = CliRunner().invoke(app, ["report", str(moved), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)
    res = CliRunner().invoke(app, ["verify", str(moved), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["verified"] is True


def test_pinned_inputs_and_devices_are_in_the_manifest(tmp_path, digits_file):  # noqa: F811
    from gpucampaign.close.manifest import _device_of
    from gpucampaign.core.files import sha256_file

    src = _campaign(tmp_path / "src", digits_file)
    base = _pin_base_model(src, "base.bin")
    spec = load_spec(src)
    out = tmp_path / "out"
    kept = keep_inputs(out, spec, base_dir=src.parent)
    digest = sha256_file(base)
    assert kept["pinned"]["base"] | {"size": 0} == {
        "spec_path": "base.bin",
        "kind": "copied",
        "path": "inputs/base/base.bin",
        "name": "base.bin",
        "sha256": digest,
        "size": 0,
    }
    assert sha256_file(out / "inputs" / "base" / "base.bin") == digest  # kept in the folder
    # The manifest's run entries carry the device each run recorded in its params.json.
    rid = _train_control(spec, src=src.parent, out=out, stop_after_steps=2)
    assert _device_of(OutputFolder(out), rid) == {"device": "cpu"}


@pytest.mark.process
def test_a_moved_folder_resumes_a_campaign_with_pinned_inputs_from_its_copies(
    tmp_path: Path,
    digits_file: tuple[Path, str],  # noqa: F811
) -> None:
    from gpucampaign.restartcheck.scheduled import verify_checkpoint_resume

    spec_file = _campaign(tmp_path / "src", digits_file)
    _pin_base_model(spec_file, "models/base.bin")
    spec = load_spec(spec_file)
    out = tmp_path / "out"
    OutputFolder(out).keep_spec(spec_file.read_bytes(), source="test")
    keep_inputs(out, spec, base_dir=spec_file.parent)
    rid = _train_control(spec, src=spec_file.parent, out=out, checkpoint_every=2)

    moved = tmp_path / "elsewhere" / "out"
    shutil.copytree(out, moved)
    shutil.rmtree(tmp_path / "src")  # the spec's folder, with the input, is gone
    shutil.rmtree(out)
    target = output_check_target(moved)
    assert target.inputs == {"base": moved / "inputs" / "base" / "base.bin"}
    assert target.runs["control"] == rid
    report = verify_checkpoint_resume(
        target.for_run("control", out=moved, workdir=tmp_path / "work"), m_steps=2
    )
    assert report.identical
    # Without the copies the check says which input it could not find.
    (moved / "inputs" / "base" / "base.bin").write_bytes(b"altered")
    with pytest.raises(Exception, match="input 'base'"):
        verify_checkpoint_resume(
            output_check_target(moved).for_run("control", out=moved, workdir=tmp_path / "work2"),
            m_steps=2,
        )
