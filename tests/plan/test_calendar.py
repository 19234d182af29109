"""The calendar planner: lanes, span, window fit, options, warnings, ablation."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucampaign.config import SpecError, load_spec, parse_spec
from gpucampaign.plan import calendar
from tests.helpers.fuzzing import examples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Every part an end-to-end calendar with GPU work needs: with these, no warning.
COMPLETE = [
    {"name": "load", "kind": "machine", "resource": "cpu", "hours": 1},
    {"name": "checkpoint-save-transfer-restore", "kind": "machine", "resource": "gpu", "hours": 1},
    {"name": "eval", "kind": "machine", "resource": "gpu", "hours": 1},
    {"name": "outputs", "kind": "machine", "resource": "cpu", "hours": 1},
    {"name": "retrieve", "kind": "machine", "resource": "none", "hours": 1},
]


def spec_of(calendar_: list[dict[str, Any]], **kw: Any) -> Any:
    data = {"name": "t", "packages": [{"gpu": "rtx4090", "days": 3}], "calendar": calendar_}
    return parse_spec({**data, **kw})


def gpu(name: str, hours: float, **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": "machine", "resource": "gpu", "hours": hours, **kw}


# --- lanes ------------------------------------------------------------------------


def test_two_independent_gpu_steps_serialize_on_one_rtx4090() -> None:
    p = calendar.plan(spec_of([gpu("a", 10), gpu("b", 10)]))
    assert p.span_hours == 20 and p.gpu_lanes == 1
    assert {s.lane for s in p.steps} == {"gpu0"}


def test_a_b200_lot_gives_two_lanes() -> None:
    p = calendar.plan(
        spec_of(
            [gpu("a", 10), gpu("b", 10)], packages=[{"gpu": "b200", "days": 3, "price_usd": 300}]
        )
    )
    assert p.span_hours == 10 and p.gpu_lanes == 2
    assert sorted(s.lane for s in p.steps) == ["gpu0", "gpu1"]
    assert p.total_price_usd == Decimal("300")  # two GPUs, one lot, one price


def test_count_two_gives_two_lanes_and_costs_94_28() -> None:
    p = calendar.plan(
        spec_of([gpu("a", 10), gpu("b", 10)], packages=[{"gpu": "rtx4090", "days": 3, "count": 2}])
    )
    assert (p.span_hours, p.gpu_lanes, p.total_price_usd) == (10, 2, Decimal("94.28"))


def test_a_second_lane_never_shortens_one_step() -> None:
    p = calendar.plan(
        spec_of(
            [gpu("a", 10), gpu("b", 5, after=["a"])],
            packages=[{"gpu": "rtx4090", "days": 3, "count": 2}],
        )
    )
    assert p.span_hours == 15


def test_cpu_and_human_steps_overlap_gpu_work() -> None:
    p = calendar.plan(
        spec_of(
            [
                gpu("train", 10),
                {"name": "index", "kind": "machine", "resource": "cpu", "hours": 4},
                {"name": "copy", "kind": "machine", "resource": "none", "hours": 4},
                {"name": "write", "kind": "human", "hours": 6},
            ]
        )
    )
    assert p.span_hours == 10
    assert all(s.start_hours == 0 for s in p.steps)
    assert p.step("index").lane != p.step("copy").lane  # drawn on separate host lanes


def test_human_steps_use_people_lanes() -> None:
    cal = [{"name": "a", "kind": "human", "hours": 3}, {"name": "b", "kind": "human", "hours": 3}]
    assert calendar.plan(spec_of(cal)).span_hours == 6
    assert calendar.plan(spec_of(cal, people=2)).span_hours == 3


def test_ready_steps_start_by_tier() -> None:
    p = calendar.plan(
        spec_of([gpu("x", 1, tier="exploratory"), gpu("u", 1, tier="useful"), gpu("e", 1)])
    )
    assert [s.name for s in sorted(p.steps, key=lambda s: s.start_hours)] == ["e", "u", "x"]


# --- the user's examples ------------------------------------------------------------


def test_48h_example() -> None:
    p = calendar.plan(load_spec(EXAMPLES / "calendar-48h.yaml"))
    assert (p.span_hours, p.window_hours, p.uncommitted_hours, p.overrun_hours) == (48, 72, 24, 0)
    assert p.fits and p.options == () and p.warnings == ()
    assert p.total_price_usd == Decimal("47.14")
    assert p.human_hours + p.machine_hours == 48


def test_78h_example_options() -> None:
    p = calendar.plan(load_spec(EXAMPLES / "calendar-78h.yaml"))
    assert (p.span_hours, p.overrun_hours, p.fits) == (78, 6, False)
    options = {o.kind: o for o in p.options}
    larger = options["larger_package"]
    assert (larger.total_price_usd, larger.window_hours, larger.fits) == (Decimal("110"), 168, True)
    smaller = options["smaller_protocol"]
    assert (smaller.dropped, smaller.span_hours, smaller.fits) == (("variant-long",), 48, True)
    second = options["second_lot"]
    assert second.total_price_usd == Decimal("94.28") and second.span_hours < 78


def test_reduce_to_fit_drops_exploratory_before_useful() -> None:
    spec = load_spec(EXAMPLES / "calendar-78h.yaml")
    p, dropped = calendar.reduce_to_fit(spec)
    assert dropped == ["variant-long"] and p.fits and p.span_hours == 48
    # a re-forecast that makes the control longer forces the useful variant out too
    p, dropped = calendar.reduce_to_fit(spec, hours_override={"control": 40})
    assert dropped == ["variant-lr", "variant-long"] and p.fits and p.span_hours == 64


def test_reduce_to_fit_keeps_what_is_not_needed_to_drop() -> None:
    spec = spec_of(
        [gpu("e", 60), gpu("long", 20, tier="exploratory"), gpu("short", 5, tier="exploratory")]
    )
    p, dropped = calendar.reduce_to_fit(spec)
    assert dropped == ["long"] and p.span_hours == 65


def test_reduce_to_fit_when_essentials_alone_do_not_fit() -> None:
    p, dropped = calendar.reduce_to_fit(spec_of([gpu("e", 80), gpu("x", 1, tier="useful")]))
    assert dropped == ["x"] and not p.fits and p.span_hours == 80


def test_no_second_lot_option_for_a_chain_of_gpu_steps() -> None:
    p = calendar.plan(spec_of([gpu("a", 40), gpu("b", 40, after=["a"])]))
    assert not p.fits
    assert "second_lot" not in {o.kind for o in p.options}


def test_drop_bridges_dependencies() -> None:
    spec = spec_of([gpu("a", 5), gpu("b", 5, after=["a"]), gpu("c", 5, after=["b"])])
    p = calendar.plan(spec, drop=["b"])
    assert p.dropped == ("b",) and p.step("c").after == ("a",) and p.span_hours == 10
    with pytest.raises(KeyError):
        p.step("b")


def test_hours_override_replaces_hours() -> None:
    p = calendar.plan(spec_of([gpu("a", 5)]), hours_override={"a": 7.5})
    assert p.span_hours == 7.5 and p.to_dict()["hours_override"] == {"a": 7.5}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hours_override": {"zz": 1}}, "hours_override"),
        ({"hours_override": {"a": 0}}, "hours_override.a"),
        ({"hours_override": {"a": float("nan")}}, "hours_override.a"),
        ({"drop": ["zz"]}, "drop"),
    ],
)
def test_bad_override_or_drop(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        calendar.plan(spec_of([gpu("a", 5)]), **kwargs)
    assert err.value.field == field


# --- window ----------------------------------------------------------------------------------


def test_window_defaults_to_the_shortest_lot() -> None:
    p = calendar.plan(spec_of([gpu("a", 5)], packages=[{"gpu": "rtx4090", "days": 7}]))
    assert p.window_hours == 168


def test_window_shorter_than_every_lot_is_invalid() -> None:
    with pytest.raises(SpecError) as err:
        calendar.plan(spec_of([gpu("a", 5)], window_hours=48))
    assert err.value.field == "window_hours"


def test_window_longer_than_the_longest_lot_warns() -> None:
    p = calendar.plan(spec_of([gpu("a", 5)], window_hours=100))
    assert any("longer than the longest committed lot" in w for w in p.warnings)


def test_infinite_hours_are_refused() -> None:
    with pytest.raises(SpecError) as err:
        calendar.plan(spec_of([gpu("a", float("inf"))]))
    assert err.value.field == "calendar[0].hours"


# --- warnings and ablation ------------------------------------------------------


def test_complete_calendar_has_no_missing_part_warning() -> None:
    assert calendar.plan(spec_of(COMPLETE)).warnings == ()


@pytest.mark.parametrize(
    ("removed", "part"),
    [
        ("load", "loading"),
        ("eval", "validation"),
        ("outputs", "output writing"),
        ("retrieve", "results retrieval"),
    ],
)
def test_missing_part_is_named(removed: str, part: str) -> None:
    p = calendar.plan(spec_of([s for s in COMPLETE if s["name"] != removed]))
    assert [w for w in p.warnings if f"no {part} step" in w]


def test_missing_checkpoint_parts_are_named_separately() -> None:
    cal = [s for s in COMPLETE if not s["name"].startswith("checkpoint")] + [gpu("ckpt-save", 1)]
    warnings = calendar.plan(spec_of(cal)).warnings
    assert any("no checkpoint transfer step" in w for w in warnings)
    assert any("no checkpoint restore step" in w for w in warnings)
    assert not any("no checkpoint write step" in w for w in warnings)


def test_calendar_without_gpu_work_needs_no_checkpoint() -> None:
    assert calendar.plan(spec_of([{"name": "think", "kind": "human", "hours": 2}])).warnings == ()


def _ablation_spec(variants: list[dict[str, Any]]) -> Any:
    cal = (
        COMPLETE
        + [gpu("control", 1, run="control")]
        + [gpu(v["name"], 1, run=v["name"]) for v in variants]
    )
    return spec_of(cal, control={"lr": 0.001, "epochs": 20}, variants=variants)


def test_ablation_lists_factors_per_variant() -> None:
    p = calendar.plan(_ablation_spec([{"name": "v-lr", "changes": {"lr": 0.003}}]))
    assert [(a.variant, a.factors) for a in p.ablation] == [("v-lr", ("lr",))]
    assert p.to_dict()["ablation"][0]["changes"] == {"lr": {"control": 0.001, "variant": 0.003}}
    assert p.warnings == ()


def test_ablation_warnings() -> None:
    p = calendar.plan(
        _ablation_spec(
            [
                {"name": "same", "changes": {"lr": 0.001}},
                {"name": "two", "changes": {"lr": 0.01, "precision": "bf16"}},
            ]
        )
    )
    assert any("'same' changes nothing" in w for w in p.warnings)
    assert any("'two' changes 2 factors" in w for w in p.warnings)


def test_declared_combination_is_not_warned_but_a_full_grid_is() -> None:
    declared = [{"name": "both", "changes": {"lr": 0.01, "precision": "bf16"}, "combined": True}]
    assert calendar.plan(_ablation_spec(declared)).warnings == ()
    grid = declared + [
        {"name": "lr", "changes": {"lr": 0.01}},
        {"name": "bf16", "changes": {"precision": "bf16"}},
    ]
    assert any(
        "full grid" in w and "lr x precision" in w
        for w in calendar.plan(_ablation_spec(grid)).warnings
    )


def test_run_without_calendar_step_warns() -> None:
    spec = spec_of(COMPLETE, control={"lr": 0.001})
    assert any("run 'control' has no calendar step" in w for w in calendar.plan(spec).warnings)


def test_markdown_mentions_span_and_options() -> None:
    text = calendar.render_markdown(calendar.plan(load_spec(EXAMPLES / "calendar-78h.yaml")))
    assert "Span **78 h**" in text and "110.00 USD" in text


# --- properties ----------------------------------------------------------------------------------


@st.composite
def calendars(draw: st.DrawFn) -> tuple[Any, dict[str, dict[str, Any]]]:
    n = draw(st.integers(1, 12))
    steps = []
    for i in range(n):
        kind = draw(st.sampled_from(["gpu", "gpu", "cpu", "none", "human"]))
        step: dict[str, Any] = {
            "name": f"s{i}",
            "kind": "human" if kind == "human" else "machine",
            "hours": draw(st.sampled_from([0.25, 0.5, 1, 1.5, 2, 3, 7, 10])),
            "tier": draw(st.sampled_from(["essential", "useful", "exploratory"])),
            "after": sorted(draw(st.sets(st.sampled_from([f"s{j}" for j in range(i)]), max_size=3)))
            if i
            else [],
        }
        if kind != "human":
            step["resource"] = kind
        steps.append(step)
    package = draw(
        st.sampled_from(
            [
                {"gpu": "rtx4090", "days": 3, "count": 1},
                {"gpu": "rtx4090", "days": 3, "count": 3},
                {"gpu": "b200", "days": 3, "price_usd": 100},
            ]
        )
    )
    people = draw(st.integers(1, 2))
    spec = spec_of(steps, packages=[package], people=people)
    return spec, {s["name"]: s for s in steps}


def _longest_chain(steps: dict[str, dict[str, Any]]) -> float:
    finish: dict[str, float] = {}
    for name, s in steps.items():  # names are in a topological order
        finish[name] = s["hours"] + max((finish[a] for a in s["after"]), default=0.0)
    return max(finish.values())


@settings(max_examples=examples(150), deadline=None)
@given(calendars())
def test_plan_properties(case: tuple[Any, dict[str, dict[str, Any]]]) -> None:
    spec, steps = case
    p = calendar.plan(spec)
    eps = 1e-9
    assert p.span_hours >= _longest_chain(steps) - eps
    assert p.span_hours <= sum(s["hours"] for s in steps.values()) + eps
    by_name = {s.name: s for s in p.steps}
    for s in p.steps:
        for a in steps[s.name]["after"]:
            assert s.start_hours >= by_name[a].end_hours - eps
    for lane in {s.lane for s in p.steps}:
        on_lane = sorted((s for s in p.steps if s.lane == lane), key=lambda s: s.start_hours)
        for first, second in zip(on_lane, on_lane[1:], strict=False):
            assert second.start_hours >= first.end_hours - eps
    assert {s.lane for s in p.steps if s.resource == "gpu"} <= {
        f"gpu{i}" for i in range(p.gpu_lanes)
    }
    assert {s.lane for s in p.steps if s.kind == "human"} <= {
        f"human{i}" for i in range(p.human_lanes)
    }
    assert p.to_dict() == calendar.plan(spec).to_dict()


@settings(max_examples=examples(60), deadline=None)
@given(calendars())
def test_reduce_to_fit_properties(case: tuple[Any, dict[str, dict[str, Any]]]) -> None:
    spec, steps = case
    p, dropped = calendar.reduce_to_fit(spec)
    assert all(steps[name]["tier"] != "essential" for name in dropped)
    assert list(p.dropped) == dropped
    if calendar.plan(spec).fits:
        assert dropped == []
    elif not p.fits:  # nothing but essentials left
        assert {n for n, s in steps.items() if s["tier"] != "essential"} == set(dropped)


def test_gantt_with_planned_and_actual_bars(tmp_path: Path) -> None:
    from gpucampaign.close.figures import plot_calendar

    p = calendar.plan(load_spec(EXAMPLES / "calendar-48h.yaml"))
    actual = [
        {"name": "control", "start_hours": 12, "end_hours": 29.5},
        {"name": "hotfix", "start_hours": 30, "end_hours": 31},  # not in the plan: its own row
    ]
    out = plot_calendar(p, tmp_path / "gantt.png", actual=actual)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_a_seed_run_is_placed_by_its_own_calendar_step():
    """`plan` asks for a step of each seed run (`wider.s1`); a step naming it is accepted and
    placed, and then nothing warns about it: no warning that refusal contradicts."""
    from gpucampaign.config import SpecError, parse_spec
    from gpucampaign.plan.lanes import lane_order

    def spec_with(*runs: str):
        return parse_spec(
            {
                "name": "x",
                "packages": [{"gpu": "rtx4090", "days": 3}],
                "control": {"recipe": "mlp", "hidden": [16], "batch_size": 128, "epochs": 2},
                "variants": [{"name": "wider", "changes": {"hidden": [32]}, "seeds": [0, 1]}],
                "calendar": [
                    {
                        "name": f"train-{r}",
                        "kind": "machine",
                        "resource": "gpu",
                        "hours": 1,
                        "run": r,
                    }
                    for r in runs
                ],
            }
        )

    asked = calendar.plan(spec_with("control", "wider"))
    assert any("run 'wider.s1' has no calendar step" in w for w in asked.warnings)
    spec = spec_with("control", "wider", "wider.s1")
    placed = calendar.plan(spec)
    assert not any("no calendar step" in w for w in placed.warnings), placed.warnings
    assert "train-wider.s1" in {s.name for s in placed.steps}
    assert "wider.s1" in [run for _, run in lane_order(placed, spec=spec)]
    with pytest.raises(SpecError, match=r"nor a seed run \(wider\.s1\)"):
        spec_with("control", "wider.s2")
