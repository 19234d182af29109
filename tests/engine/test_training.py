"""The training loop: output files, resume from the pilot, recipes, schedules, precisions,
save interval."""

from __future__ import annotations

import json
import math
import multiprocessing
import statistics

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gpucampaign.builtin import build_model
from gpucampaign.checkpoint.savepolicy import choose_save_interval, daly_interval
from gpucampaign.config import RunConfig, SpecError
from gpucampaign.core.errors import ArgumentError, FolderError
from gpucampaign.core.stoprules import NoUsableRestart
from gpucampaign.engine.loop import train_run
from gpucampaign.folder.layout import RunFolder
from gpucampaign.folder.metrics import read_metrics
from gpucampaign.modelfolder import load_model_dir, predict
from gpucampaign.plan.reforecast import pilot_measures
from gpucampaign.storage import LocalStore
from tests.helpers import corpus_of, digits_file, make_spec, run, run_dir, train_losses  # noqa: F401


def test_a_run_writes_its_folder(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    res = run(spec, tmp_path)
    folder = run_dir(spec, tmp_path)
    assert res.completed and res.steps_done == res.planned_steps == 20 and not res.reused
    assert (
        set(res.metrics) == {"accuracy", "macro_f1", "loss"}
        and res.metrics == res.eval_metrics["test"]
    )
    params = json.loads((folder / "params.json").read_text())
    assert params["run_id"] == res.run_id == spec.resolve_run("control").run_id
    assert (
        params["config"] == spec.control.model_dump(mode="json") and params["planned_steps"] == 20
    )
    rows = read_metrics(folder / "metrics.jsonl")
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 21))
    for r in train:
        assert set(r) >= {"step", "epoch", "loss", "lr", "step_s", "samples_per_s"}
        assert float(np.float32(r["loss"])) == r["loss"]  # the float32 loss, not a rounded copy
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [(r["step"], r["split"]) for r in evals if not r["final"]] == [(10, "val"), (20, "val")]
    assert {r["split"] for r in evals if r["final"]} == {"val", "test"}
    assert [r["step"] for r in rows if r["kind"] == "checkpoint"] == [5, 20]  # early save, final
    assert (folder / "model" / "model.safetensors").is_file()
    cfg = json.loads((folder / "model" / "config.json").read_text())
    assert (
        cfg["run_config"] == spec.control.model_dump(mode="json")
        and cfg["base_model_revision"] is None
    )
    assert cfg["versions"]["torch"] == torch.__version__ and "commit" in cfg["git"]
    recorded = json.loads((folder / "result.json").read_text())
    assert recorded["run_id"] == res.run_id and recorded["completed"]
    t = res.timings
    assert t["load_s"] > 0 and t["step_s"] > 0 and len(t["eval_s"]) == 4 and len(t["save_s"]) == 2
    assert (
        t["restore_s"] == 0 and t["total_s"] >= t["train_s"] > 0 and res.resumed_from_step is None
    )


def test_rerunning_a_completed_run_returns_the_record(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    first = run(spec, tmp_path)
    metrics = (run_dir(spec, tmp_path) / "metrics.jsonl").read_bytes()
    again = run(spec, tmp_path)
    assert again.reused and again.metrics == first.metrics and again.steps_done == first.steps_done
    assert (run_dir(spec, tmp_path) / "metrics.jsonl").read_bytes() == metrics


def test_the_pilot_is_the_start_of_the_real_run(tmp_path, digits_file):  # noqa: F811
    control = {"dropout": 0.2, "scheduler": "cosine", "epochs": 3}
    spec = make_spec(tmp_path, digits_file, control=control)
    whole = run(spec, tmp_path, out="whole")
    pilot = run(spec, tmp_path, out="split", stop_after_steps=7)  # mid-epoch
    # The early save at step 5, then the pilot's own at 7.
    assert not pilot.completed and pilot.steps_done == 7 and pilot.n_checkpoints == 2
    assert not (run_dir(spec, tmp_path, out="split") / "result.json").exists()
    # A rerun of the pilot trains nothing.
    again = run(spec, tmp_path, out="split", stop_after_steps=7)
    assert (
        again.steps_done == 7 and again.resumed_from_step == 7 and again.timings["train_s"] == 0.0
    )
    rest = run(spec, tmp_path, out="split")
    assert rest.completed and rest.resumed_from_step == 7 and rest.timings["restore_s"] > 0
    assert train_losses(run_dir(spec, tmp_path, out="split") / "metrics.jsonl") == train_losses(
        run_dir(spec, tmp_path, out="whole") / "metrics.jsonl"
    )
    a = load_file(run_dir(spec, tmp_path, out="whole") / "model" / "model.safetensors")
    b = load_file(run_dir(spec, tmp_path, out="split") / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rest.metrics == whole.metrics


def test_a_pilot_on_a_fresh_folder_past_its_checkpoint_keeps_the_measured_costs(
    tmp_path,
    digits_file,  # noqa: F811
):
    # Host a trained past the pilot; host b (a fresh folder, the same store) reruns the pilot.
    spec = make_spec(tmp_path, digits_file, control={"epochs": 3}, checkpoint={"every_steps": 5})
    store = LocalStore(tmp_path / "shared-store")
    corpus = corpus_of(tmp_path, spec)

    def pilot(host: str, steps: int):
        return train_run(
            spec,
            run=spec.resolve_run("control"),
            corpus=corpus,
            store=store,
            run_folder=RunFolder.of(tmp_path / host, spec.resolve_run("control").run_id),
            stop_after_steps=steps,
        )

    trained = pilot("host-a", 15)
    again = pilot("host-b", 5)
    assert again.resumed_from_step == 15 and again.n_checkpoints == 0
    assert again.timings["train_s"] == 0.0
    measured = pilot_measures(spec.resolve_run("control"), result=again, n_train=1259)
    # Not 0 (which would re-forecast the training as free): the checkpoint's own measures.
    assert measured["step_s"] == trained.timings["step_s"] > 0
    assert measured["save_s"] > 0


def test_rows_after_the_checkpoint_are_dropped_on_resume(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    run(spec, tmp_path, stop_after_steps=6)
    path = run_dir(spec, tmp_path) / "metrics.jsonl"
    with open(path, "a") as f:  # rows a crashed process wrote after its last checkpoint
        f.write(json.dumps({"kind": "train", "step": 7, "epoch": 0, "loss": 9.0}) + "\n")
    run(spec, tmp_path)
    steps = [s for s, _ in train_losses(path)]
    assert steps == list(range(1, 21))
    assert [r["step"] for r in read_metrics(path) if r["kind"] == "restore"] == [6]


def test_another_configs_checkpoint_is_never_resumed(tmp_path, digits_file):  # noqa: F811
    a = make_spec(tmp_path, digits_file)
    b = make_spec(tmp_path, digits_file, control={"lr": 0.02})
    assert a.resolve_run("control").run_id != b.resolve_run("control").run_id
    run(a, tmp_path, stop_after_steps=6)
    ck = tmp_path / "out" / "checkpoints"
    (ck / a.resolve_run("control").run_id).rename(
        ck / b.resolve_run("control").run_id
    )  # planted under b's run ID
    with pytest.raises(NoUsableRestart, match="belongs to run"):
        run(b, tmp_path)
    fresh = make_spec(
        tmp_path, digits_file, control={"lr": 0.02}, stop_rules={"require_restart": False}
    )
    res = run(fresh, tmp_path)
    assert (
        res.completed
        and res.resumed_from_step is None
        and "belongs to run" in res.refused_checkpoints[0]
    )


def test_saved_model_reloads_and_predicts_deterministically(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    res = run(spec, tmp_path)
    model = load_model_dir(run_dir(spec, tmp_path) / "model")
    test = corpus_of(tmp_path, spec).split("test")
    pred, conf = predict(model, test.X)
    pred2, conf2 = predict(load_model_dir(run_dir(spec, tmp_path) / "model"), test.X)
    assert np.array_equal(pred, pred2) and np.array_equal(conf, conf2)
    assert float((pred == test.y).mean()) == res.metrics["accuracy"]
    assert conf.dtype == np.float32 and ((conf > 0) & (conf <= 1)).all()
    (run_dir(spec, tmp_path) / "model" / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(FolderError, match="sha256"):
        load_model_dir(run_dir(spec, tmp_path) / "model")


def test_cnn_recipe(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(
        tmp_path, digits_file, control={"recipe": "cnn", "hidden": [4, 8], "max_steps": 6}
    )
    res = run(spec, tmp_path)
    assert res.completed and res.steps_done == 6
    model = load_model_dir(run_dir(spec, tmp_path) / "model")
    assert any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    with pytest.raises(SpecError, match="square"):
        build_model(RunConfig(recipe="cnn"), n_features=10, n_classes=3)


@pytest.mark.parametrize("scheduler", ["none", "step", "cosine"])
def test_schedulers(tmp_path, digits_file, scheduler):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"scheduler": scheduler, "max_steps": 9})
    run(spec, tmp_path)
    lrs = [
        r["lr"]
        for r in read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
        if r["kind"] == "train"
    ]
    if scheduler == "none":
        assert set(lrs) == {0.01}
    elif scheduler == "step":  # x0.1 every third of the 9 planned steps
        assert (
            lrs[:3] == [0.01] * 3 and math.isclose(lrs[3], 0.001) and math.isclose(lrs[6], 0.0001)
        )
    else:
        assert lrs[0] == 0.01 and all(a > b for a, b in zip(lrs, lrs[1:], strict=False))


def test_eval_every_n_steps(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"eval_every": 4, "max_steps": 12})
    run(spec, tmp_path)
    rows = read_metrics(run_dir(spec, tmp_path) / "metrics.jsonl")
    assert [r["step"] for r in rows if r["kind"] == "eval" and not r["final"]] == [4, 8, 12]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_on_cpu(tmp_path, digits_file, precision):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, control={"precision": precision, "max_steps": 8})
    res = run(spec, tmp_path)
    assert res.completed and res.precision == precision
    assert all(
        math.isfinite(loss) for _, loss in train_losses(run_dir(spec, tmp_path) / "metrics.jsonl")
    )


def test_progress_callback(tmp_path, digits_file):  # noqa: F811
    seen: list[dict] = []
    spec = make_spec(tmp_path, digits_file)
    run(spec, tmp_path, progress=seen.append, show_progress=True)  # not a terminal: no bar
    assert seen and seen[-1]["step"] == seen[-1]["planned_steps"] == 20
    assert {"run_id", "step", "planned_steps", "loss", "epoch", "lr", "fraction"} <= set(seen[0])
    # The live record too: the last evaluation, the measured rate and the ETA.
    assert {"metric", "metric_value", "metric_step", "steps_per_s", "eta_s"} <= set(seen[-1])
    assert seen[-1]["eta_s"] == 0 and seen[-1]["steps_per_s"] > 0
    live = json.loads((run_dir(spec, tmp_path) / "progress.json").read_text())
    assert live["state"] == "done" and live["step"] == 20 and live["metric_value"] is not None


def test_bad_arguments(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    with pytest.raises(ArgumentError, match="stop_after_steps"):
        run(spec, tmp_path, stop_after_steps=0)
    with pytest.raises(SpecError, match="no run named"):
        train_run(
            spec,
            run=spec.resolve_run("nope"),
            corpus=corpus_of(tmp_path, spec),
            store=LocalStore(tmp_path / "s"),
            run_folder=RunFolder.scratch(tmp_path / "o", "r"),
        )


def test_daly_interval():
    delta, m = 30.0, 24 * 3600.0
    r = delta / (2 * m)
    assert daly_interval(delta, m) == pytest.approx(
        math.sqrt(2 * delta * m) * (1 + math.sqrt(r) / 3 + r / 9) - delta
    )
    assert daly_interval(3 * m, m) == m and daly_interval(2 * m, m) == m
    # Young's first-order sqrt(2 delta M) is the leading term for small delta.
    assert daly_interval(0.01, m) == pytest.approx(math.sqrt(2 * 0.01 * m), rel=1e-3)
    with pytest.raises(ValueError):
        daly_interval(1.0, 0.0)


def test_save_interval_is_the_smaller_of_daly_and_tolerable_loss():
    m = 24 * 3600.0
    by_daly = choose_save_interval(
        delta_s=1.0, step_s=0.5, mtbi_s=m, tolerable_s=3600, planned_steps=10**6
    )
    assert by_daly.tau_s == by_daly.daly_s < 3600 and by_daly.every_steps == int(
        by_daly.tau_s // 0.5
    )
    by_loss = choose_save_interval(
        delta_s=60.0, step_s=0.5, mtbi_s=m, tolerable_s=600, planned_steps=10**6
    )
    assert by_loss.tau_s == 600 < by_loss.daly_s and by_loss.every_steps == 1200
    capped = choose_save_interval(
        delta_s=1.0, step_s=0.5, mtbi_s=m, tolerable_s=600, planned_steps=50
    )
    assert capped.every_steps == 50


def test_run_records_its_save_interval(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file, checkpoint={"tolerable_loss_minutes": 1e-5})
    res = run(spec, tmp_path)
    si = res.save_interval
    assert si["source"] == "measured" and si["tau_s"] == si["tolerable_s"] == pytest.approx(60e-5)
    assert si["delta_s"] > 0 and si["step_s"] > 0 and si["mtbi_s"] == 24 * 3600
    # Daly's steps, but never fewer than the measured background write takes.
    write_floor = min(20, math.ceil(si["write_s"] / si["step_s"])) if si["write_s"] else 1
    assert si["every_steps"] == max(1, min(20, int(si["tau_s"] // si["step_s"])), write_floor)
    assert si["delta_s"] == pytest.approx(statistics.median(res.timings["stall_s"]))
    fixed = run(
        make_spec(tmp_path, digits_file, control={"lr": 0.02}, checkpoint={"every_steps": 4}),
        tmp_path,
    )
    assert (
        fixed.save_interval["source"] == "spec"
        and fixed.checkpoint_every == 4
        and fixed.n_checkpoints == 5
    )


def test_a_crash_after_the_final_save_finishes_without_training(tmp_path, digits_file):  # noqa: F811
    spec = make_spec(tmp_path, digits_file)
    first = run(spec, tmp_path)
    folder = run_dir(spec, tmp_path)
    (folder / "result.json").unlink()  # killed after the last checkpoint, before the record
    import shutil

    shutil.rmtree(folder / "model")
    again = run(spec, tmp_path)
    assert again.completed and again.resumed_from_step == 20
    assert again.timings["steps_s_sum"] == first.timings["steps_s_sum"]  # no step ran again
    assert again.metrics == first.metrics and (folder / "model" / "model.safetensors").is_file()


def test_data_loader_workers_give_the_same_run(
    tmp_path,
    digits_file,  # noqa: F811
):
    """Workers only fetch batches: same run ID, same losses, bit for bit; the run stops its
    persistent workers when it returns (left to the garbage collector, each costs 5 s later)."""
    plain = make_spec(tmp_path, digits_file, control={"epochs": 1})
    loaded = make_spec(
        tmp_path, digits_file, control={"epochs": 1, "num_workers": 2, "persistent_workers": True}
    )
    assert loaded.resolve_run("control").run_id == plain.resolve_run("control").run_id
    assert loaded.run_config("control").num_workers == 2
    run(plain, tmp_path, out="a")
    run(loaded, tmp_path, out="b")
    assert not multiprocessing.active_children()  # the workers stopped with the run
    a = train_losses(run_dir(plain, tmp_path, out="a") / "metrics.jsonl")
    b = train_losses(run_dir(loaded, tmp_path, out="b") / "metrics.jsonl")
    assert len(a) == 10 and a == b
