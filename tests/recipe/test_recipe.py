"""Bring-your-own training code: a recipe written in the test's folder, trained end to end,
resumed exactly, reloaded without pickle; every bad-recipe class gives a clear error."""

from __future__ import annotations

import json
import shutil
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import gpucampaign
from gpucampaign.config import CampaignSpec, SpecError, parse_spec
from gpucampaign.core.files import sha256_file
from gpucampaign.core.stoprules import EssentialInputMissing
from gpucampaign.data.corpus import load_spec_corpus
from gpucampaign.data.pins import input_sha256
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.modelfolder import RecipeCodeNotTrusted, load_model_dir
from gpucampaign.recipe.contract import RecipeError, load_recipe
from gpucampaign.storage import LocalStore
from tests.helpers.specs import REGRESS_RECIPE as RECIPE


def write_recipe(folder: Path, body: str = RECIPE) -> str:
    """Write ``body`` as a uniquely named module in ``folder``; its module name."""
    name = f"user_recipe_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    return name


def write_corpus(folder: Path, n: int = 96) -> str:
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, 2, generator=g)
    y = 2 * X[:, 0] - X[:, 1] + 0.05 * torch.randn(n, generator=g)
    lines = [f"{a:.6f} {b:.6f} {c:.6f}" for (a, b), c in zip(X.tolist(), y.tolist(), strict=True)]
    path = folder / "points.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sha256_file(path)


def make_spec(
    base: Path, module: str, *, control: dict | None = None, **extra: Any
) -> CampaignSpec:
    from gpucampaign.config.recipefile import use_recipe_dir

    use_recipe_dir(base)  # what load_spec does for a spec file
    sha = (
        write_corpus(base)
        if not (base / "points.txt").exists()
        else sha256_file(base / "points.txt")
    )
    data: dict[str, Any] = {
        "name": "byo",
        "packages": [{"gpu": "rtx4090", "days": 3}],
        "calendar": [{"name": "prep", "kind": "human", "hours": 1}],
        "corpus": {"path": "points.txt", "sha256": sha},
        "control": {
            "recipe": f"{module}:Regress",
            "args": {"width": 4},
            "batch_size": 8,
            "epochs": 2,
            "lr": 0.05,
            "threads": 1,
            **(control or {}),
        },
        "variants": [{"name": "wide", "changes": {"args": {"width": 8}}}],
        "decision_rule": {
            "metric": "mse",
            "direction": "minimize",
            "threshold": 10.0,
            "select_split": "val",
        },
        "pilot": {"steps": 3},
        **extra,
    }
    return parse_spec(data)


def train(spec: CampaignSpec, base: Path, run: str = "control", **kw: Any):
    resolved = spec.resolve_run(run)
    corpus = load_spec_corpus(spec, base_dir=base, run_id=resolved.run_id)
    return train_run(
        spec,
        run=resolved,
        corpus=corpus,
        store=LocalStore(base / "out" / "ck"),
        run_folder=RunFolder.of(base / "out", resolved.run_id),
        **kw,
    )


def test_recipe_is_public() -> None:
    assert gpucampaign.Recipe is load_recipe("mlp").__class__.__mro__[-2]


def test_a_recipe_trains_end_to_end_and_reloads(tmp_path: Path) -> None:
    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    res = train(spec, tmp_path)
    assert res.completed and res.steps_done == res.planned_steps == 12
    assert set(res.metrics) == {"mse"} and res.metrics["mse"] < 10
    folder = tmp_path / "out" / "runs" / spec.resolve_run("control").run_id
    params = json.loads((folder / "params.json").read_text())
    assert params["recipe"] == f"{module}:Regress" and params["args"] == {"width": 4}
    assert params["recipe_sha256"] == sha256_file(tmp_path / f"{module}.py")
    assert params["recipe_file"] == f"{module}.py" and str(tmp_path) not in json.dumps(params)
    assert params["n_train"] == 48 and params["device"] == "cpu"
    cfg = json.loads((folder / "model" / "config.json").read_text())
    assert cfg["recipe"] == f"{module}:Regress" and cfg["args"] == {"width": 4}
    assert cfg["recipe_sha256"] == params["recipe_sha256"]
    assert cfg["corpus"] == {"path": "points.txt", "sha256": spec.corpus.sha256, "kind": "file"}
    kept = folder / "model" / "recipe" / f"{module}.py"
    files = cfg["files"]
    assert sha256_file(kept) == cfg["recipe_sha256"] == files[f"recipe/{module}.py"]["sha256"]
    assert str(tmp_path) not in (folder / "model" / "config.json").read_text()
    model = load_model_dir(folder / "model")
    x = torch.tensor([[0.5, 0.25]])
    assert model(x).shape == (1, 1)


def test_a_recipe_model_folder_reloads_on_its_own_and_reproduces_its_predictions(
    tmp_path: Path,
) -> None:
    import sys

    from gpucampaign.modelfolder.recipe_reload import recipe_reload_check, write_recipe_predictions

    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    res = train(spec, tmp_path)
    out = tmp_path / "out"
    corpus = load_spec_corpus(spec, base_dir=tmp_path)
    rows = write_recipe_predictions(out, res.run_id, corpus=corpus, split="test")
    assert len(rows) == 3 and set(rows[0]) == {"batch", "rows", "mse"}  # 24 rows, batch 8
    weights = torch.nn.Sequential(*load_model_dir(out / "runs" / res.run_id / "model"))
    (tmp_path / f"{module}.py").unlink()  # the user's file is gone: the folder's copy serves
    sys.modules.pop(module, None)
    with pytest.raises(RecipeCodeNotTrusted, match="--trust-folder-code"):
        load_model_dir(out / "runs" / res.run_id / "model")  # only when trusted
    assert module not in sys.modules
    again = load_model_dir(out / "runs" / res.run_id / "model", trust_folder_code=True)
    assert all(
        torch.equal(a, b)
        for a, b in zip(weights.state_dict().values(), again.state_dict().values(), strict=True)
    )
    check = recipe_reload_check(out, res.run_id, corpus=corpus, trust_folder_code=True)
    assert check["ok"] and check["rows"] == 3 and check["mismatches"] == 0
    (out / "runs" / res.run_id / "predictions.csv").write_text("batch,rows,mse\n0,8,0.5\n")
    assert not recipe_reload_check(out, res.run_id, corpus=corpus, trust_folder_code=True)["ok"]


def test_a_variant_changes_args_and_the_recipe_file_is_in_the_run_id(tmp_path: Path) -> None:
    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    assert spec.run_config("wide").args == {"width": 8}
    assert spec.resolve_run("wide").run_id != spec.resolve_run("control").run_id
    res = train(spec, tmp_path, run="wide")
    assert res.completed
    cfg = json.loads((tmp_path / "out" / "runs" / res.run_id / "model" / "config.json").read_text())
    assert cfg["args"] == {"width": 8}
    before = spec.resolve_run("control").run_id
    path = tmp_path / f"{module}.py"
    path.write_text(path.read_text() + "\n# edited\n")
    assert make_spec(tmp_path, module).resolve_run("control").run_id != before


@pytest.mark.process
def test_a_resumed_recipe_run_is_identical(tmp_path: Path) -> None:
    from gpucampaign.restartcheck.check import verify_restart

    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    report = verify_restart(
        spec, run=spec.resolve_run("control"), base_dir=tmp_path, workdir=tmp_path / "rc"
    )
    assert report.identical and report.k_mid_epoch and len(report.compared) > 0


def test_a_changed_corpus_file_stops(tmp_path: Path) -> None:
    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module)
    (tmp_path / "points.txt").write_text("1 2 3\n")
    with pytest.raises(EssentialInputMissing, match="changed"):
        load_spec_corpus(spec, base_dir=tmp_path, run_id=spec.resolve_run("control").run_id)


def test_a_folder_corpus_is_pinned_by_its_manifest(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("0.1 0.2 0.0\n0.3 0.4 0.2\n")
    (data / "sub" / "b.txt").write_text("0.5 0.6 0.4\n0.7 0.8 0.6\n")
    module = write_recipe(
        tmp_path,
        RECIPE.replace(
            "ctx.corpus.path.read_text()",
            "''.join(p.read_text() for p in sorted(ctx.corpus.path.rglob('*.txt')))",
        ),
    )
    spec = make_spec(
        tmp_path,
        module,
        corpus={"path": "data", "sha256": input_sha256(data)},
        control={"batch_size": 1, "epochs": 1},
    )
    res = train(spec, tmp_path)
    assert res.completed and res.steps_done == 2
    (data / "sub" / "b.txt").write_text("0.5 0.6 0.4\n0.7 0.8 0.7\n")
    with pytest.raises(EssentialInputMissing, match="folder"):
        load_spec_corpus(spec, base_dir=tmp_path, run_id=spec.resolve_run("control").run_id)


def test_a_base_model_input_is_pinned_and_given_to_the_recipe(tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.mkdir()
    module = write_recipe(first)
    spec1 = make_spec(first, module)
    res1 = train(spec1, first)
    base_model = first / "out" / "runs" / res1.run_id / "model"
    second = tmp_path / "second"
    second.mkdir()
    shutil.copytree(base_model, second / "base")  # the earlier campaign's model folder
    tuned = write_recipe(
        second,
        RECIPE
        + """

class FineTune(Regress):
    def model(self, ctx):
        from safetensors.torch import load_file
        m = super().model(ctx)
        m.load_state_dict(load_file(str(ctx.inputs["base"].path / "model.safetensors")))
        return m
""",
    )
    pin = input_sha256(second / "base")
    spec2 = make_spec(
        second,
        tuned,
        control={"recipe": f"{tuned}:FineTune", "epochs": 1},
        inputs={"base": {"path": "base", "sha256": pin}},
    )
    res2 = train(spec2, second)
    assert res2.completed
    cfg = json.loads((second / "out" / "runs" / res2.run_id / "model" / "config.json").read_text())
    assert cfg["inputs"]["base"]["sha256"] == pin and cfg["inputs"]["base"]["kind"] == "folder"
    (second / "base" / "config.json").write_text("{}")
    with pytest.raises(EssentialInputMissing, match="input 'base'"):
        load_spec_corpus(spec2, base_dir=second, run_id=spec2.resolve_run("control").run_id)


# --- bad recipes ------------------------------------------------------------------------------
BAD = {
    "import": ("does_not_exist_xyz:Nope", None, "does not import"),
    "not a Recipe": (None, "class Regress:\n    pass\n", "not a subclass of gpucampaign.Recipe"),
    "missing method": (
        None,
        "from gpucampaign import Recipe\nclass Regress(Recipe):\n"
        "    def model(self, ctx):\n        return None\n",
        "datasets(): the method is missing",
    ),
    "non-scalar loss": (
        None,
        RECIPE.replace("mse_loss(model(x), y)", "mse_loss(model(x), y, reduction='none')"),
        "loss(): must return a scalar tensor",
    ),
    "wrong metric": (
        None,
        RECIPE.replace('return {"mse": se / n}', 'return {"mae": se / n}'),
        "evaluate(): did not return 'mse'",
    ),
    "broken module": (None, "raise RuntimeError('boom')\n", "does not import (RuntimeError: boom)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_recipe_names_the_recipe_and_the_method(tmp_path: Path, case: str) -> None:
    recipe, body, message = BAD[case]
    if recipe is None:
        recipe = f"{write_recipe(tmp_path, body)}:Regress"
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")) as exc:
        spec = make_spec(
            tmp_path, recipe.partition(":")[0], control={"recipe": recipe}, variants=[]
        )
        train(spec, tmp_path)
    assert recipe in str(exc.value) and isinstance(exc.value, SpecError)


def test_the_datasets_without_train_are_refused(tmp_path: Path) -> None:
    body = RECIPE.replace('return {"train": ', 'return {"val": ')
    body = body.replace('"val": TensorDataset(X[n // 2', '"test": TensorDataset(X[n // 2', 1)
    module = write_recipe(tmp_path, body)
    spec = make_spec(tmp_path, module, variants=[])
    with pytest.raises(RecipeError, match=r"datasets\(\): returned no 'train' split"):
        train(spec, tmp_path)


@pytest.mark.process
@pytest.mark.parametrize("case", ["not a Recipe", "wrong metric", "non-scalar loss"])
def test_the_cli_reports_a_bad_recipe_with_exit_2_and_no_traceback(
    tmp_path: Path, case: str
) -> None:
    import subprocess
    import sys

    import yaml

    module = write_recipe(tmp_path, BAD[case][1])
    spec = make_spec(tmp_path, module, variants=[])
    data = spec.model_dump(mode="json")
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(data))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucampaign.cli",
            "run",
            str(tmp_path / "campaign.yaml"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    said = " ".join((proc.stderr + proc.stdout).split())
    assert f"{module}:Regress" in said and BAD[case][2] in said


def test_pin_prints_the_sha256_of_a_file_or_a_folder(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpucampaign.cli import app

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("x")
    got = CliRunner().invoke(app, ["pin", str(tmp_path / "d")])
    assert got.exit_code == 0 and got.output.strip() == input_sha256(tmp_path / "d")
    assert CliRunner().invoke(app, ["pin", str(tmp_path / "nope")]).exit_code == 2


def test_the_audit_checks_the_recipe_splits(tmp_path: Path) -> None:
    from gpucampaign.recipe.audit import audit_corpus

    module = write_recipe(tmp_path)
    spec = make_spec(tmp_path, module, variants=[])
    report = audit_corpus(spec, base_dir=tmp_path)
    assert report["ok"] and report["rows"] == {"total": 96, "train": 48, "val": 24, "test": 24}
    assert report["kind"] == "file" and report["bytes"] > 0 and report["n_hard"] == 0
    shared = write_recipe(
        tmp_path,
        RECIPE.replace(
            '        return {"train": TensorDataset',
            "        for ds in (a := TensorDataset(X, y), b := TensorDataset(X, y)):\n"
            "            ds.ids = list(range(len(X)))\n"
            '        return {"train": a, "val": b}\n'
            '        return {"train": TensorDataset',
        ),
    )
    spec = make_spec(tmp_path, shared, variants=[])
    with pytest.raises(EssentialInputMissing, match="in two splits"):
        audit_corpus(spec, base_dir=tmp_path)


def test_a_loss_that_raises_mid_training_is_one_paragraph(tmp_path: Path) -> None:
    """The step, the recipe's file and line, the exception; the traceback kept in the run's
    folder (named), the user's folder cut from its paths."""
    body = RECIPE.replace(
        "        x, y = batch\n        return torch.nn.functional.mse_loss(model(x), y)",
        "        x, y = batch\n        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        if self.calls == 3:\n            raise ValueError('boom at the third batch')\n"
        "        return torch.nn.functional.mse_loss(model(x), y)",
    )
    assert body != RECIPE
    module = write_recipe(tmp_path, body)
    line = next(
        n for n, text in enumerate(textwrap.dedent(body).splitlines(), 1) if "raise Value" in text
    )
    spec = make_spec(tmp_path, module, variants=[])
    with pytest.raises(RecipeError) as caught:
        train(spec, tmp_path)
    text = str(caught.value)
    kept = RunFolder.of(tmp_path / "out", spec.resolve_run("control").run_id).path
    kept = kept / "recipe-error.txt"
    assert text == (
        f"recipe '{module}:Regress', loss() at step 3 ({module}.py, line {line}): raised "
        f"ValueError: boom at the third batch; its traceback is in {kept}"
    )
    trace = kept.read_text()
    assert "Traceback" in trace and f'File "{module}.py", line {line}' in trace
    assert str(tmp_path) not in trace


def test_the_kept_traceback_says_no_password_of_an_exception_it_chains(tmp_path: Path) -> None:
    """A loss that fails while handling an error whose text holds ``password='...'`` (the
    secret made at run time, so the source lines shown hold none): ``recipe-error.txt`` keeps
    the traceback of both, the password redacted in each."""
    secret = "Pw7Chained" + "Zq9Kept"
    body = RECIPE.replace(
        "        x, y = batch\n        return torch.nn.functional.mse_loss(model(x), y)",
        "        x, y = batch\n        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        if self.calls == 3:\n"
        "            try:\n"
        "                pw = 'Pw7Chained' + 'Zq9Kept'\n"
        "                raise ConnectionError(f\"connect(host='db', password='{pw}')\")\n"
        "            except ConnectionError:\n"
        "                raise RuntimeError('the metrics database is down')\n"
        "        return torch.nn.functional.mse_loss(model(x), y)",
    )
    assert body != RECIPE and secret not in body
    spec = make_spec(tmp_path, write_recipe(tmp_path, body), variants=[])
    with pytest.raises(RecipeError) as caught:
        train(spec, tmp_path)
    kept = RunFolder.of(tmp_path / "out", spec.resolve_run("control").run_id).path
    trace = (kept / "recipe-error.txt").read_text()
    assert "ConnectionError: connect(host='db', password='***')" in trace, trace
    assert "RuntimeError: the metrics database is down" in trace
    assert secret not in trace and secret not in str(caught.value)
