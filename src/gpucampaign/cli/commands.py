"""The ``campaign`` command (typer + rich).

Exit codes: 0 success; 2 invalid input; 3 stopped by a stop rule before a decision; 4 plan
does not fit its window (plan) or output not verified (verify); 130 / 143 interrupted by SIGINT
/ SIGTERM (saved; rerun to resume); 1 unexpected.

The commands on an output folder are in ``cli_output``; what the commands share (the app, the
consoles, the exit codes) in ``cli/common.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpucampaign.cli.common import (
    EXIT_NOT_FIT,
    EXIT_STOPPED,
    AsJson,
    SpecFile,
    app,
    console,
    err_console,
    esc,
    handle_errors,
    print_json,
    say,
)
from gpucampaign.cli.progress import PLAIN_EVERY_S
from gpucampaign.core.errors import ArgumentError, InputError
from gpucampaign.core.stoprules import StopRule
from gpucampaign.core.storageurl import LOCAL, is_local
from gpucampaign.folder.layout import MANIFEST, REPORT_MD, TIMELINE

if TYPE_CHECKING:  # the preflight loads the recipes' modules: only `campaign run` imports it
    from gpucampaign.preflight import OpenCampaign

_CALIBRATE_HELP = (
    "Output folder of a closed campaign (repeat it for several): their measured load, step, "
    "eval and save times replace the hours of the steps that train a run (the median over the "
    "campaigns), and the errors of their re-forecasts set each step's p10-p90 range."
)
_OUTPUT_CHECK_HELP = (
    "Check this campaign output instead: resume the run's latest kept checkpoint from its store "
    "in a new process and compare with what the run recorded."
)


# Commands are defined below, one section per phase of the campaign.


# --- planning: schema, plan, packages ------------------------------------------------------


@app.command("schema")
@handle_errors
def schema_cmd() -> None:
    """Print the JSON schema of a campaign spec (every field with its description)."""
    from gpucampaign.config import CampaignSpec

    print_json(CampaignSpec.model_json_schema())


@app.command("plan")
@handle_errors
def plan_cmd(
    spec: SpecFile,
    as_json: AsJson = False,
    figure: Path | None = typer.Option(None, "--figure", help="Also write the Gantt chart (PNG)."),
    calibrate_from: list[Path] | None = typer.Option(
        None, "--calibrate-from", help=_CALIBRATE_HELP
    ),
) -> None:
    """Schedule the calendar on the committed lots: exit 0 when it fits its window, 4 when not."""
    from gpucampaign.config import load_spec
    from gpucampaign.plan import calendar
    from gpucampaign.plan.ranges import DEFAULT_SPREAD, hours_range
    from gpucampaign.preflight import preflight

    cs = load_spec(spec)
    checked = preflight(cs, base_dir=spec.resolve().parent)
    override, how, spread = (
        _calibration(cs, spec, calibrate_from) if calibrate_from else ({}, {}, DEFAULT_SPREAD)
    )
    try:
        result = calendar.plan(cs, base_dir=spec.resolve().parent, hours_override=override or None)
    except InputError as exc:
        raise type(exc)(f"Invalid campaign spec '{spec}': {exc}", field=exc.field) from None
    if not as_json:
        for line in checked.checked:
            say(f"checked: {esc(line)}")
    ranges = {name: hours_range(h, spread) for name, h in override.items()} if how else {}
    if how and not as_json:
        for name, text in how.items():
            lo, hi = ranges[name]
            say(f"{esc(name)}: {override[name]:.4g} h, p10-p90 {lo:.4g}-{hi:.4g} h ({esc(text)})")
    if figure is not None:
        from gpucampaign.close.figures import plot_calendar

        plot_calendar(result, figure)
    if as_json:
        calibrated = (
            {"calibrated": how, "ranges": {k: list(v) for k, v in ranges.items()}} if how else {}
        )
        print_json({**result.to_dict(), **calibrated, "preflight": checked.to_dict()})
    else:
        _print_plan(result, figure=figure)
    if not result.fits:
        raise typer.Exit(EXIT_NOT_FIT)


def _calibration(
    cs: Any, spec: Path, outs: list[Path]
) -> tuple[dict[str, float], dict[str, str], tuple[float, float]]:
    """The run steps' hours from earlier campaigns' ``estimates.json`` (the median over them),
    how each was measured, and the p10-p90 spread of actual / re-forecast their reports
    observed (``plan.ranges``)."""
    from gpucampaign.close.forecast import load_estimates
    from gpucampaign.close.report import read_report
    from gpucampaign.core.files import median
    from gpucampaign.data.corpus import load_spec_corpus
    from gpucampaign.plan.ranges import observed_ratios, spread_of
    from gpucampaign.plan.reforecast import calibrated_hours
    from gpucampaign.recipe.runtime import train_rows

    n_train = None
    if cs.corpus is not None and cs.control is not None:
        try:
            corpus = load_spec_corpus(cs, base_dir=spec.resolve().parent)
            # The control's train split as its recipe builds it: a table's rows, or the
            # examples a recipe makes of a pinned file or folder (the corpus is no table then).
            n_train = train_rows(cs.resolve_run("control"), corpus=corpus)
        except (InputError, StopRule, OSError):
            n_train = None  # planning needs no corpus: the earlier campaign's row count stands in
    each, ratios = [], []
    for out in outs:
        each.append(calibrated_hours(cs, estimates=load_estimates(out), n_train=n_train))
        try:
            ratios += observed_ratios(read_report(out))
        except InputError:
            pass  # estimates without a report: the hours calibrate, the range stays the default
    hours = {k: float(median(h[k][0] for h in each) or 0.0) for k in each[0]}
    how = {k: "; ".join(h[k][1] for h in each) for k in each[0]}
    return hours, how, spread_of(ratios)


def _print_plan(result: Any, *, figure: Path | None) -> None:
    from rich.table import Table

    from gpucampaign.plan.evidence import evidence_lines
    from gpucampaign.plan.machines import one_process_line
    from gpucampaign.plan.tariffs import format_usd

    d = result.to_dict()
    table = Table(title=f"calendar of {esc(d['name'])}", title_justify="left")
    columns = ("step", "kind", "tier", "lane", "start h", "end h", "hours")
    for k, col in enumerate(columns):
        table.add_column(col, justify="left" if k < 4 else "right", no_wrap=col == "lane")
    for s in sorted(d["steps"], key=lambda s: (s["start_hours"], s["lane"])):
        kind = "human" if s["kind"] == "human" else f"machine/{s['resource']}"
        hours = (f"{s['start_hours']:g}", f"{s['end_hours']:g}", f"{s['hours']:g}")
        lane = s["machine"] or s["lane"]  # a GPU lane as its machine says it: lot 2 / gpu0
        table.add_row(esc(s["name"]), esc(kind), s["tier"], esc(lane), *hours)
    console.print(table)
    if (where := one_process_line(result.machines, distributed=False)) is not None:
        say(esc(where))
    lots = esc(
        ", ".join(
            f"{p['count']} x {p['days']}-day {p['gpu']} ({p['gpus']} GPU/lot)"
            for p in d["packages"]
        )
    )
    verdict = (
        f"[green]fits[/], {d['uncommitted_hours']:g} h uncommitted"
        if d["fits"]
        else f"[red]does not fit[/]: {d['overrun_hours']:g} h over"
    )
    say(
        f"span [bold]{d['span_hours']:g} h[/] in a {d['window_hours']:g} h window: {verdict}\n"
        f"machine {d['machine_hours']:g} h (GPU {d['gpu_hours']:g} h), "
        f"human {d['human_hours']:g} h; lots: {lots}; total {format_usd(result.total_price_usd)}"
    )
    for o in d["options"]:
        say(
            f"  option [bold]{esc(o['kind'])}[/]: {esc(o['description'])}; "
            f"requires: {esc(o['requires'])}"
        )
    for a in d["ablation"]:
        factors = ", ".join(a["factors"]) or "changes nothing"
        say(f"  ablation {esc(a['variant'])} ({a['tier']}): {esc(factors)}")
    for line in evidence_lines(d.get("evidence")):
        say(esc(line))
    for w in d["warnings"]:
        say(f"[yellow]warning:[/] {esc(w)}")
    if figure is not None:
        say(f"figure: {esc(figure)}")


@app.command("packages")
@handle_errors
def packages_cmd(
    hours: float = typer.Option(..., "--hours", help="Hours the calendar needs (its span)."),
    gpu: str | None = typer.Option(None, "--gpu", help="Only lots of this GPU model."),
    catalog: Path | None = typer.Option(None, "--catalog", help="Extra catalog YAML file."),
    calibrate_from: Path | None = typer.Option(
        None,
        "--calibrate-from",
        help="Output folder of a closed campaign: its recorded "
        "restore time prices each switch between back-to-back lots.",
    ),
    as_json: AsJson = False,
) -> None:
    """Lots and back-to-back lot combinations that cover H hours, cheapest first (exit 4: none)."""
    from rich.table import Table

    from gpucampaign.close.forecast import load_estimates
    from gpucampaign.plan.tariffs import format_usd, load_catalog, packages_covering

    restore_s = None
    if calibrate_from is not None:
        restore_s = (load_estimates(calibrate_from).get("measured") or {}).get("restore_s")
    covers = packages_covering(hours, gpu=gpu, catalog=load_catalog(catalog), restore_s=restore_s)
    if as_json:
        print_json({"hours": hours, "gpu": gpu, "covers": [c.to_dict() for c in covers]})
    elif covers:
        table = Table(title=f"lots covering {hours:g} h, cheapest first", title_justify="left")
        for col in ("gpu", "lots (days)", "hours", "slack h", "price", "requires"):
            table.add_column(col, overflow="fold")
        for c in covers:
            days = " + ".join(map(str, c.days))
            price = format_usd(c.price_usd)
            table.add_row(
                esc(c.gpu), days, f"{c.total_hours:g}", f"{c.slack_hours:g}", price, esc(c.requires)
            )
        console.print(table)
    if not covers:
        err_console.print(
            f"no lot or combination of up to 3 lots covers {hours:g} h", highlight=False
        )
        raise typer.Exit(EXIT_NOT_FIT)


# --- engine: init, restart-check ------------------------------------------------------------


@app.command("init")
@handle_errors
def init_cmd(
    directory: Path = typer.Argument(..., help="Folder for the new campaign (created if needed)."),
    example: str = typer.Option(
        "digits",
        "--example",
        help="'digits' (built-in MLP on a table) or 'textlm' (your own "
        "recipe: a character-level transformer on a text file).",
    ),
) -> None:
    """Write a ready campaign: DIR/campaign.yaml and its pinned corpus (exit 2: exists)."""
    from gpucampaign.cli.scaffold import init_campaign
    from gpucampaign.cli.scaffold_textlm import init_textlm

    if example not in ("digits", "textlm"):
        raise ArgumentError(
            f"option '--example': '{example}' is not an example; use 'digits' or 'textlm'.",
            field="--example",
        )
    spec_path = init_textlm(directory) if example == "textlm" else init_campaign(directory)
    say(f"wrote {esc(spec_path)} and its corpus under {esc(directory / 'data')}")
    say(f"next: campaign plan {esc(spec_path)}")


@app.command("pin")
@handle_errors
def pin_cmd(
    path: Path = typer.Argument(..., help="A file or a folder to pin."), as_json: AsJson = False
) -> None:
    """Print the sha256 that pins PATH in a spec (a folder: the sha256 of its manifest)."""
    from gpucampaign.data.pins import folder_manifest, input_sha256

    if not path.exists():
        raise ArgumentError(f"'{path}' does not exist: give a file or a folder.", field="PATH")
    sha = input_sha256(path)
    if as_json:
        rows = folder_manifest(path) if path.is_dir() else None
        print_json({"path": str(path), "sha256": sha, "files": rows})
        return
    say(sha)


@app.command("restart-check")
@handle_errors
def restart_check_cmd(
    spec: SpecFile,
    run: str = typer.Option("control", "--run", help="Run whose configuration is checked."),
    as_json: AsJson = False,
    n_steps: int | None = typer.Option(
        None, "--steps", min=2, help="Steps compared (default: ~2 epochs)."
    ),
    k_steps: int | None = typer.Option(
        None, "--at", min=1, help="Step of the interruption (default: mid-epoch)."
    ),
    out: Path | None = typer.Option(None, "--out", help=_OUTPUT_CHECK_HELP),
) -> None:
    """Save mid-epoch, resume in a new process, compare exactly: exit 0 identical, 3 otherwise."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="restart-check-") as tmp:
        if out is not None:
            report = _check_output_restart(spec, out, run=run, n_steps=n_steps, workdir=Path(tmp))
        else:
            report = _check_fresh_restart(
                spec, run=run, n_steps=n_steps, k_steps=k_steps, workdir=Path(tmp)
            )
    first = ("identical", "compared_steps", "max_abs_diff", "save_s", "restore_s")
    if as_json:
        d = report.to_dict()
        print_json({**{k: d[k] for k in first}, **{k: v for k, v in d.items() if k not in first}})
    else:
        _print_restart(report)
    if not report.identical:
        raise typer.Exit(EXIT_STOPPED)


def _check_fresh_restart(
    spec: Path, *, run: str, n_steps: int | None, k_steps: int | None, workdir: Path
) -> Any:
    """Train the run from scratch, interrupt it, resume it in a new process, compare."""
    from gpucampaign.config import load_spec
    from gpucampaign.data.corpus import corpus_path
    from gpucampaign.data.pins import resolve_inputs
    from gpucampaign.restartcheck.check import verify_restart

    cs = load_spec(spec)
    path = corpus_path(cs, base_dir=spec.resolve().parent)
    return verify_restart(
        cs,
        run=cs.resolve_run(run),
        corpus_path=path,
        inputs=resolve_inputs(cs, base_dir=spec.resolve().parent),
        workdir=workdir,
        n_steps=n_steps,
        k_steps=k_steps,
        check=False,
    )


def _check_output_restart(
    spec: Path, out: Path, *, run: str, n_steps: int | None, workdir: Path
) -> Any:
    """Resume the run's latest kept checkpoint of a campaign output and compare."""
    from gpucampaign.config import load_spec
    from gpucampaign.restartcheck.scheduled import output_check_target, verify_checkpoint_resume

    load_spec(spec)
    target = output_check_target(out, spec_path=spec)
    if run not in target.runs:
        raise ArgumentError(
            f"option '--run': run '{run}' has no checkpoint in {target.store.url}; "
            f"runs with checkpoints: {', '.join(target.runs)}.",
            field="--run",
        )
    return verify_checkpoint_resume(
        target.for_run(run, out=out, workdir=workdir), m_steps=n_steps or 20, check=False
    )


def _print_restart(report: Any) -> None:
    if report.mode == "stopped":  # a run a stop rule ended: its last checkpoint, checked
        say(f"{esc(report.run_id)}: [green]stopped run, checkpoint sound[/]: {esc(report.checked)}")
        return
    verdict = "[green]identical[/]" if report.identical else "[red]NOT identical[/]"
    if report.checked:
        say(f"{esc(report.run_id)}: {esc(report.checked)}")
    say(
        f"{esc(report.run_id)}: {verdict} over {report.compared_steps} steps (interrupted at step "
        f"{report.k}, {report.threads} thread(s), {esc(report.device)}); max |diff| "
        f"{report.max_abs_diff:g}; save {report.save_s or 0:.3f} s, "
        f"restore {report.restore_s or 0:.3f} s"
    )
    say(f"  {esc(report.applies)}")
    for m in report.mismatches[:5]:
        say(f"  [red]{esc(m)}[/]")


# --- run: the whole campaign --------------------------------------------------------------


@app.command("run")
@handle_errors
def run_cmd(
    spec: SpecFile,
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: out/<name>)."),
    decision: str | None = typer.Option(
        None, "--decision", help="Override decision_point.mode: 'auto' or 'ask' (Prefect UI)."
    ),
    grace: float = typer.Option(
        20.0, "--grace", help="Seconds a Ctrl-C or SIGTERM may take to save and stop.", min=0.1
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Show Prefect's own INFO logs (server, task runs)."
    ),
    progress_every: float = typer.Option(
        PLAIN_EVERY_S,
        "--progress-every",
        help="Without a terminal: seconds between two progress lines of a phase.",
        min=0.1,
    ),
) -> None:
    """Run the whole campaign in this process (embedded Prefect, local storage); rerun to resume.

    One live line per training phase (run, step, loss, the decision metric, steps/s, ETA, the
    lot's time left); plain lines every --progress-every seconds without a terminal.
    Ctrl-C or SIGTERM saves a checkpoint at the next step, stops and exits 130 or 143; a
    second Ctrl-C exits at once.
    """
    import time

    from gpucampaign.cli.progress import Background, LiveView
    from gpucampaign.cli.runner import (
        interruptible_run,
        load_flow,
        quiet_expected_stops,
        start_server_early,
    )
    from gpucampaign.cli.starting import embedded_environment
    from gpucampaign.core.interrupt import stop_requested
    from gpucampaign.folder.lock import writer_lock
    from gpucampaign.plan.rental import rental_of
    from gpucampaign.preflight import open_campaign

    # Refused before Prefect starts and before the folder is written: one paragraph, exit 2.
    opened = open_campaign(spec, out)  # the flow is handed this value: it opens nothing again
    cs, target = opened.spec, opened.folder.root
    if decision not in (None, "auto", "ask"):
        raise ArgumentError(
            f"option '--decision': '{decision}' is not a mode; use 'auto' or 'ask'.",
            field="--decision",
        )
    if opened.sealed is not None:  # closed for good: verified, never closed again
        _sealed_rerun(opened)
        return
    for line in _before_the_start(spec, opened, decision=decision):
        err_console.print(line, soft_wrap=True, highlight=False)
    # Prefect's INFO lines (its server's hint, every task run's state) stay out of the
    # terminal unless asked for: the progress lines say what runs.
    embedded_environment(verbose=verbose)  # as the first line set it when run as `campaign`
    _named_server_answers()
    # After the checks (a refused run starts nothing), before Prefect and the flows load
    # here: the server boots in its own process meanwhile.
    early = start_server_early()
    state = None
    try:
        flow = load_flow("campaign")
        if not verbose:  # after the import: Prefect sets its loggers up then
            quiet_expected_stops()
        rental = rental_of(cs)
        view = LiveView(
            target,
            console=err_console,
            ends_at=rental.ends_at if rental else None,
            every_s=progress_every,
            since=time.time(),
        )
        with writer_lock(target) as took_over, interruptible_run(grace_s=grace, early=early):
            if took_over:
                err_console.print(f"[yellow]note:[/] {esc(took_over)}", soft_wrap=True)
            with Background(view):
                state = flow(
                    spec=opened, out=str(target), decision_mode=decision, return_state=True
                )
    except BaseException:
        if stop_requested() is None:
            raise
    finally:
        if early is not None and not early.adopted:  # refused before the flow ran
            early.stop()
    _end_of_run(state, target=target, question=cs.question)


def _before_the_start(spec: Path, opened: OpenCampaign, *, decision: str | None) -> list[str]:
    """What the user learns before the campaign starts: one line when its calendar does not fit
    its window (the overrun and ``campaign plan``'s options; the decision point after the
    pilot then reduces it or re-poses the question, as the spec's ``decision_point`` says), one
    when the folder holds a closed campaign (a rerun repeats nothing), one when its lots are
    several machines (their lanes run here, in this process)."""
    from gpucampaign.plan.machines import one_process_line

    lines, target = [], opened.folder.root
    if (target / MANIFEST).is_file():
        lines.append(
            f"[bold]closed resumable:[/] {esc(target)} is sealed (manifest.json) with runs "
            "left: they resume from their checkpoints; no finished run trains again and its "
            f"recorded stops stand; the folder is closed again. Its report: "
            f"{esc(target / REPORT_MD)}"
        )
    d = opened.plan.to_dict()
    if not d["fits"]:
        mode = decision or opened.spec.decision_point.mode
        options = ", ".join(o["kind"] for o in d["options"]) or "none"
        lines.append(
            f"[yellow]warning:[/] the calendar does not fit its window: {d['overrun_hours']:g} h "
            f"over (span {d['span_hours']:g} h in {d['window_hours']:g} h); options: "
            f"{esc(options)} (`campaign plan {esc(spec)}` says each). The campaign starts; its "
            f"decision point after the pilot (mode {mode}) reduces the runs to fit or re-poses "
            "the question."
        )
    # `campaign run` runs every lane in its one process, whatever the lots: say so.
    if (where := one_process_line(opened.plan.machines, distributed=False)) is not None:
        lines.append(esc(where))
    return lines


def _named_server_answers() -> None:
    """A Prefect server of the user's (``PREFECT_API_URL``) answers, or exit 2 (nothing
    written); none named: `campaign run` starts its own."""
    import os

    from gpucampaign.cli.runner import load_embedded

    if os.environ.get("PREFECT_API_URL"):
        load_embedded("require_named_server")(
            fix="unset PREFECT_API_URL: `campaign run` then starts a temporary server of its own."
        )


def _sealed_rerun(opened: OpenCampaign) -> None:
    """A rerun of a campaign closed for good: verified against its manifest, nothing written;
    exit 4 when it no longer verifies, else as its first run ended (3 stopped or re-posed)."""
    from gpucampaign.verify.sealed import recheck_sealed

    assert opened.sealed is not None
    target = opened.folder.root
    summary = recheck_sealed(target, expect=opened.sealed)
    err_console.print(
        f"[bold]closed campaign:[/] {esc(summary['already_closed'])}",
        soft_wrap=True,
        highlight=False,
    )
    _print_run_summary(summary, target=target, question=opened.spec.question)
    if not summary["verified"]:
        err_console.print(
            f"[bold red]NOT verified:[/] {esc('; '.join(summary['problems']))}", soft_wrap=True
        )
        raise typer.Exit(EXIT_NOT_FIT)
    if (summary["verdict"] or {}).get("kind") in ("stopped", "re-pose"):
        raise typer.Exit(EXIT_STOPPED)


def _end_of_run(state: Any, *, target: Path, question: str | None) -> None:
    """Say how the run ended and exit with its code: interrupted (130 or 143), stopped (3), or
    the summary with the answer to the question."""
    from gpucampaign.core.interrupt import exit_code, stop_requested

    if (reason := stop_requested()) is not None:
        err_console.print(
            f"[bold yellow]interrupted by {reason}:[/] the running training saved a checkpoint "
            f"and stopped; its segment is recorded in {esc(target / TIMELINE)}. Rerun the same "
            "command to resume.",
            soft_wrap=True,
            highlight=False,
        )
        raise typer.Exit(exit_code(reason))
    assert state is not None  # the flow returned: had it raised, the block above re-raised
    if state.is_cancelled():
        # Interrupted with no stop asked here (a rank of a data-parallel run stopped on its
        # own): nothing closed, so there is no verdict or report to show.
        from rich.markup import escape

        err_console.print(
            f"[bold red]stopped:[/] {escape(state.message or 'the campaign was cancelled')}",
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_STOPPED)
    summary = state.result(raise_on_failure=False)
    if isinstance(summary, BaseException):
        raise summary
    verdict = _print_run_summary(summary or {}, target=target, question=question)
    if state.is_failed():
        err_console.print(f"[bold red]stopped:[/] {esc(state.message)}", soft_wrap=True)
        raise typer.Exit(EXIT_STOPPED)
    if verdict.get("kind") == "re-pose":
        raise typer.Exit(EXIT_STOPPED)


def _print_run_summary(
    summary: dict[str, Any], *, target: Path, question: str | None = None
) -> dict[str, Any]:
    """Print what the campaign flow returned, the answer to the spec's question first;
    returns its verdict."""
    verdict = summary.get("verdict") or {}
    if question:
        console.print(f"[bold]question:[/] {esc(question)}", soft_wrap=True, highlight=False)
    if verdict.get("answer"):
        console.print(f"[bold]answer:[/] {esc(verdict['answer'])}", soft_wrap=True, highlight=False)
    runs = esc(", ".join(f"{rid} {status}" for rid, status in (summary.get("runs") or {}).items()))
    if runs:
        say(f"runs: {runs}")
    if summary.get("spent_usd") is not None:
        folder = "verified" if summary.get("verified") else "[red]NOT verified[/]"
        console.print(
            f"spent: {summary['spent_usd']:.2f} USD; output folder {folder}", highlight=False
        )
    console.print(f"[bold]verdict:[/] {esc(verdict.get('text', 'none'))}", soft_wrap=True)
    say(f"output folder: {esc(target)}  (report: {esc(target / REPORT_MD)})")
    if summary.get("manifest_sha256"):
        say(
            f"manifest.json sha256: {summary['manifest_sha256']} (keep it outside the folder; "
            f"check the folder anywhere with `campaign verify OUT --expect "
            f"{summary['manifest_sha256']}`)"
        )
    mirrored = summary.get("mirrored") or {}
    if mirrored.get("error"):
        err_console.print(
            f"[bold red]not mirrored[/] to {esc(mirrored['url'])}: the folder is only on "
            f"this machine ({esc(mirrored['error'])})",
            soft_wrap=True,
        )
    elif not is_local(mirrored.get("url", LOCAL)):
        say(
            f"mirrored to {esc(mirrored['url'])}; bring it back anywhere with "
            f"`campaign retrieve {esc(mirrored['url'])} --to DIR`"
        )
    return verdict


# The commands on an output folder: imported here, after the commands above, so that
# `campaign --help` lists them in the order of the campaign.
import gpucampaign.cli.deploy  # noqa: E402, F401
import gpucampaign.cli.output  # noqa: E402, F401
import gpucampaign.cli.predict  # noqa: E402, F401
import gpucampaign.cli.worker  # noqa: E402, F401


def main() -> None:
    """Entry point of the ``campaign`` script."""
    app()


if __name__ == "__main__":
    main()
