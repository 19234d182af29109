"""The ``campaign`` command (typer + rich).

Exit codes: 0 success; 2 invalid input; 3 stopped by a stop rule; 4 plan does not fit its
window (plan) or output not verified (verify); 130 / 143 interrupted by SIGINT / SIGTERM
(saved; rerun to resume); 1 unexpected.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from gpucampaign.spec import SpecError
from gpucampaign.stoprules import StopRule
from gpucampaign.storage import check_storage

EXIT_OK, EXIT_UNEXPECTED, EXIT_INVALID, EXIT_STOPPED, EXIT_NOT_FIT = 0, 1, 2, 3, 4

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Training campaigns on a rented GPU lot that end in a decision.",
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

# Arguments and options several commands share.
SpecFile = Annotated[Path, typer.Argument(help="Campaign YAML file.")]
OutFolder = Annotated[Path, typer.Argument(help="Output folder of a campaign.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
_CALIBRATE_HELP = (
    "Output folder of a closed campaign: its measured load, step, eval and save times replace "
    "the hours of the steps that train a run."
)
_OUTPUT_CHECK_HELP = (
    "Check this campaign output instead: resume the run's latest kept checkpoint from its store "
    "in a new process and compare with what the run recorded."
)


def handle_errors(fn: F) -> F:
    """Map our typed errors to the documented exit codes, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_INVALID) from None
        except StopRule as exc:
            err_console.print(f"[bold red]stopped:[/] {exc}", soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_STOPPED) from None

    return wrapper  # type: ignore[return-value]


def print_json(obj: Any) -> None:
    """One JSON object on stdout, nothing else."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def _say(text: str) -> None:
    """One message on stdout, wrapped by the terminal rather than by rich."""
    console.print(text, soft_wrap=True, highlight=False)


# Commands are defined below, one section per phase of the campaign.


# --- planning: schema, plan, packages ------------------------------------------------------


@app.command("schema")
@handle_errors
def schema_cmd() -> None:
    """Print the JSON schema of a campaign spec (every field with its description)."""
    from gpucampaign.spec import CampaignSpec

    print_json(CampaignSpec.model_json_schema())


@app.command("plan")
@handle_errors
def plan_cmd(
    spec: SpecFile,
    as_json: AsJson = False,
    figure: Path | None = typer.Option(None, "--figure", help="Also write the Gantt chart (PNG)."),
    calibrate_from: Path | None = typer.Option(None, "--calibrate-from", help=_CALIBRATE_HELP),
) -> None:
    """Schedule the calendar on the committed lots: exit 0 when it fits its window, 4 when not."""
    from gpucampaign import calendar
    from gpucampaign.spec import load_spec

    cs = load_spec(spec)
    check_storage(cs.storage.url)
    override, how = _calibration(cs, spec, calibrate_from) if calibrate_from else ({}, {})
    try:
        result = calendar.plan(cs, base_dir=spec.resolve().parent, hours_override=override or None)
    except SpecError as exc:
        raise SpecError(f"Invalid campaign spec '{spec}': {exc}", field=exc.field) from None
    if how and not as_json:
        for name, text in how.items():
            _say(f"{name}: {override[name]:.4g} h ({text})")
    if figure is not None:
        from gpucampaign.figures import plot_calendar

        plot_calendar(result, figure)
    if as_json:
        print_json({**result.to_dict(), **({"calibrated": how} if how else {})})
    else:
        _print_plan(result, figure=figure)
    if not result.fits:
        raise typer.Exit(EXIT_NOT_FIT)


def _calibration(cs: Any, spec: Path, out: Path) -> tuple[dict[str, float], dict[str, str]]:
    """The run steps' hours from an earlier campaign's ``estimates.json``, and how each was
    measured."""
    from gpucampaign.corpus import load_spec_corpus
    from gpucampaign.decision import calibrated_hours
    from gpucampaign.forecast import load_estimates

    estimates = load_estimates(out)
    n_train = None
    if cs.corpus is not None:
        try:
            n_train = len(load_spec_corpus(cs, base_dir=spec.resolve().parent).split("train"))
        except (SpecError, StopRule, OSError):
            n_train = None  # planning needs no corpus: the earlier campaign's row count stands in
    hours = calibrated_hours(cs, estimates=estimates, n_train=n_train)
    return {k: h for k, (h, _) in hours.items()}, {k: how for k, (_, how) in hours.items()}


def _print_plan(result: Any, *, figure: Path | None) -> None:
    from rich.table import Table

    from gpucampaign.tariffs import format_usd

    d = result.to_dict()
    table = Table(title=f"calendar of {d['name']}", title_justify="left")
    columns = ("step", "kind", "tier", "lane", "start h", "end h", "hours")
    for k, col in enumerate(columns):
        table.add_column(col, justify="left" if k < 4 else "right")
    for s in sorted(d["steps"], key=lambda s: (s["start_hours"], s["lane"])):
        kind = "human" if s["kind"] == "human" else f"machine/{s['resource']}"
        hours = (f"{s['start_hours']:g}", f"{s['end_hours']:g}", f"{s['hours']:g}")
        table.add_row(s["name"], kind, s["tier"], s["lane"], *hours)
    console.print(table)
    lots = ", ".join(
        f"{p['count']} x {p['days']}-day {p['gpu']} ({p['gpus']} GPU/lot)" for p in d["packages"]
    )
    verdict = (
        f"[green]fits[/], {d['uncommitted_hours']:g} h uncommitted"
        if d["fits"]
        else f"[red]does not fit[/]: {d['overrun_hours']:g} h over"
    )
    _say(
        f"span [bold]{d['span_hours']:g} h[/] in a {d['window_hours']:g} h window: {verdict}\n"
        f"machine {d['machine_hours']:g} h (GPU {d['gpu_hours']:g} h), "
        f"human {d['human_hours']:g} h; lots: {lots}; total {format_usd(result.total_price_usd)}"
    )
    for o in d["options"]:
        _say(f"  option [bold]{o['kind']}[/]: {o['description']}; requires: {o['requires']}")
    for a in d["ablation"]:
        factors = ", ".join(a["factors"]) or "changes nothing"
        console.print(f"  ablation {a['variant']} ({a['tier']}): {factors}", highlight=False)
    for w in d["warnings"]:
        _say(f"[yellow]warning:[/] {w}")
    if figure is not None:
        console.print(f"figure: {figure}", highlight=False)


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

    from gpucampaign.forecast import load_estimates
    from gpucampaign.tariffs import format_usd, load_catalog, packages_covering

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
                c.gpu, days, f"{c.total_hours:g}", f"{c.slack_hours:g}", price, c.requires
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
    from gpucampaign.scaffold import init_campaign
    from gpucampaign.scaffold_textlm import init_textlm

    if example not in ("digits", "textlm"):
        raise SpecError(
            f"option '--example': '{example}' is not an example; use 'digits' or 'textlm'.",
            field="--example",
        )
    spec_path = init_textlm(directory) if example == "textlm" else init_campaign(directory)
    console.print(f"wrote {spec_path} and its corpus under {directory / 'data'}", highlight=False)
    console.print(f"next: campaign plan {spec_path}", highlight=False)


@app.command("pin")
@handle_errors
def pin_cmd(
    path: Path = typer.Argument(..., help="A file or a folder to pin."), as_json: AsJson = False
) -> None:
    """Print the sha256 that pins PATH in a spec (a folder: the sha256 of its manifest)."""
    from gpucampaign.pins import folder_manifest, input_sha256

    if not path.exists():
        raise SpecError(f"'{path}' does not exist: give a file or a folder.", field="PATH")
    sha = input_sha256(path)
    if as_json:
        rows = folder_manifest(path) if path.is_dir() else None
        print_json({"path": str(path), "sha256": sha, "files": rows})
        return
    _say(sha)


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
    from gpucampaign.corpus import corpus_path
    from gpucampaign.restart import verify_restart
    from gpucampaign.spec import load_spec

    cs = load_spec(spec)
    path = corpus_path(cs, base_dir=spec.resolve().parent)
    return verify_restart(
        cs,
        run=run,
        corpus_path=path,
        workdir=workdir,
        n_steps=n_steps,
        k_steps=k_steps,
        check=False,
    )


def _check_output_restart(
    spec: Path, out: Path, *, run: str, n_steps: int | None, workdir: Path
) -> Any:
    """Resume the run's latest kept checkpoint of a campaign output and compare."""
    from gpucampaign.restart import output_check_target, verify_checkpoint_resume
    from gpucampaign.spec import load_spec

    load_spec(spec)
    target = output_check_target(out, spec_path=spec)
    if run not in target.runs:
        raise SpecError(
            f"option '--run': run '{run}' has no checkpoint in {target.store.url}; "
            f"runs with checkpoints: {', '.join(target.runs)}.",
            field="--run",
        )
    return verify_checkpoint_resume(
        target.spec,
        run=run,
        corpus_path=target.corpus_path,
        store=target.store,
        run_dir=out / "runs" / target.runs[run],
        workdir=workdir,
        m_steps=n_steps or 20,
        check=False,
    )


def _print_restart(report: Any) -> None:
    verdict = "[green]identical[/]" if report.identical else "[red]NOT identical[/]"
    _say(
        f"{report.run_id}: {verdict} over {report.compared_steps} steps (interrupted at step "
        f"{report.k}, {report.threads} thread(s), {report.device}); max |diff| "
        f"{report.max_abs_diff:g}; save {report.save_s or 0:.3f} s, "
        f"restore {report.restore_s or 0:.3f} s"
    )
    _say(f"  {report.applies}")
    for m in report.mismatches[:5]:
        _say(f"  [red]{m}[/]")


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
) -> None:
    """Run the whole campaign in this process (embedded Prefect, local storage); rerun to resume.

    Ctrl-C or SIGTERM saves a checkpoint at the next step, stops and exits 130 or 143; a
    second Ctrl-C exits at once.
    """
    from gpucampaign._runner import interruptible_run, load_flow
    from gpucampaign.folder import OutputFolder
    from gpucampaign.interrupt import exit_code, stop_requested
    from gpucampaign.spec import load_spec

    cs = load_spec(spec)
    check_storage(cs.storage.url)
    if decision not in (None, "auto", "ask"):
        raise SpecError(f"option '--decision': '{decision}' is not a mode; use 'auto' or 'ask'.")
    target = out or Path("out") / cs.name
    if target.exists() and not target.is_dir():
        raise SpecError(
            f"option '--out': '{target}' is a file, not a folder; give a new or "
            "existing output folder.",
            field="--out",
        )
    # Refused before Prefect starts: a clear message, no flow-run traceback.
    OutputFolder(target).keep_spec(spec.read_bytes(), source=f"'{spec}'", check_only=True)
    _preflight_recipes(cs, base_dir=spec.resolve().parent)
    flow = load_flow("campaign", "campaign")
    state = None
    try:
        with interruptible_run(grace_s=grace):
            state = flow(spec=str(spec), out=str(target), decision_mode=decision, return_state=True)
    except BaseException:
        if stop_requested() is None:
            raise
    if (reason := stop_requested()) is not None:
        err_console.print(
            f"[bold yellow]interrupted by {reason}:[/] the running training saved a checkpoint "
            f"and stopped; its segment is recorded in {target / 'timeline.jsonl'}. Rerun the same "
            "command to resume.",
            soft_wrap=True,
            highlight=False,
        )
        raise typer.Exit(exit_code(reason))
    summary = state.result(raise_on_failure=False)
    if isinstance(summary, BaseException):
        raise summary
    verdict = _print_run_summary(summary or {}, target=target)
    if state.is_failed():
        err_console.print(f"[bold red]stopped:[/] {state.message}", soft_wrap=True)
        raise typer.Exit(EXIT_STOPPED)
    if verdict.get("kind") == "re-pose":
        raise typer.Exit(EXIT_STOPPED)


def _preflight_recipes(cs: Any, *, base_dir: Path) -> None:
    """Try a spec's own recipes once before Prefect starts: a bad one is exit 2, no traceback.

    A missing or changed corpus is left to the flow, whose audit records the stop.
    """
    from gpucampaign.corpus import load_spec_corpus
    from gpucampaign.recipe_runtime import preflight

    if cs.control is None or cs.corpus is None or cs.needs_table():
        return
    try:
        corpus = load_spec_corpus(cs, base_dir=base_dir)
    except StopRule:
        return
    preflight(cs, corpus=corpus)


def _print_run_summary(summary: dict[str, Any], *, target: Path) -> dict[str, Any]:
    """Print what the campaign flow returned; returns its verdict."""
    verdict = summary.get("verdict") or {}
    runs = ", ".join(f"{rid} {status}" for rid, status in (summary.get("runs") or {}).items())
    if runs:
        _say(f"runs: {runs}")
    if summary.get("spent_usd") is not None:
        folder = "verified" if summary.get("verified") else "[red]NOT verified[/]"
        console.print(
            f"spent: {summary['spent_usd']:.2f} USD; output folder {folder}", highlight=False
        )
    console.print(f"[bold]verdict:[/] {verdict.get('text', 'none')}", soft_wrap=True)
    console.print(f"output folder: {target}  (report: {target / 'report.md'})")
    mirrored = summary.get("mirrored") or {}
    if mirrored.get("error"):
        err_console.print(
            f"[bold red]not mirrored[/] to {mirrored['url']}: the folder is only on "
            f"this machine ({mirrored['error']})",
            soft_wrap=True,
        )
    elif mirrored.get("url", "local") != "local":
        _say(
            f"mirrored to {mirrored['url']}; bring it back anywhere with "
            f"`campaign retrieve {mirrored['url']} --to DIR`"
        )
    return verdict


# --- close: verify and report an output folder ----------------------------------------------


@app.command("verify")
@handle_errors
def verify_cmd(
    out: OutFolder,
    as_json: AsJson = False,
    no_reload: bool = typer.Option(
        False, "--no-reload", help="Skip reloading the models (then the folder is NOT verified)."
    ),
) -> None:
    """Check an output folder against its manifest, reload every model: exit 0 verified, 4 not."""
    from gpucampaign.verify import verify_output

    if not out.is_dir():
        raise SpecError(f"'{out}' is not a folder: give a campaign's output folder.", field="OUT")
    if not any((out / name).is_file() for name in ("manifest.json", "spec.yaml", "plan.json")):
        # Not a campaign's folder (a home folder, '/'): refused rather than walked.
        raise SpecError(
            f"'{out}' is not a campaign output folder (no manifest.json, spec.yaml or "
            "plan.json): give the folder that `campaign run --out` wrote.",
            field="OUT",
        )
    report = verify_output(out, reload=not no_reload)
    verified = report.verified and not no_reload
    if as_json:
        print_json({**report.to_dict(), "verified": verified, "reload_skipped": no_reload})
    else:
        _print_verify(report, out=out, verified=verified, no_reload=no_reload)
    if not verified:
        raise typer.Exit(EXIT_NOT_FIT)


def _print_verify(report: Any, *, out: Path, verified: bool, no_reload: bool) -> None:
    for p in report.problems:
        _say(f"[red]{p.code}[/] {p.path}: {p.detail}")
    if no_reload:
        console.print("[yellow]models were not reloaded (--no-reload): not a verified output[/]")
    state = (
        "[green]verified[/]"
        if verified
        else f"[red]NOT verified[/] ({len(report.problems)} problem(s))"
    )
    _say(
        f"{out}: {state}; {report.checked_files} files checked, "
        f"{len(report.reloaded_runs)} model(s) reloaded and reproduced"
    )


@app.command("report")
@handle_errors
def report_cmd(out: OutFolder, as_json: AsJson = False) -> None:
    """Print the closing report the campaign wrote (report.json, report.md); only the budget is
    recomputed, with the expenses recorded by `campaign expense` since."""
    from rich.markdown import Markdown

    from gpucampaign.budget import render_budget_md
    from gpucampaign.ledger import budget_with_ledger
    from gpucampaign.report import REPORT_MD, read_report, report_summary, with_budget

    report = read_report(out)
    budget = budget_with_ledger(out, report["budget"])
    changed = budget["expenses"] != report["budget"].get("expenses")
    report = with_budget(report, budget)
    if as_json:
        print_json(report_summary(report))
        return
    md = out / REPORT_MD
    console.print(
        Markdown(md.read_text(encoding="utf-8")) if md.is_file() else report_summary(report)
    )
    if changed:
        console.print(
            Markdown(
                "## Budget with the ledger (recomputed now)\n\nExpenses were recorded with "
                "`campaign expense` after the close; the budget above is the one closed.\n\n"
                + render_budget_md(budget)
            )
        )


@app.command("expense")
@handle_errors
def expense_cmd(
    out: OutFolder,
    usd: float = typer.Option(..., "--usd", help="Amount paid in USD, as on the receipt."),
    what: str = typer.Option(..., "--what", help="What was paid for (one line)."),
    order_ref: str | None = typer.Option(
        None, "--order-ref", help="The provider's order reference, to match the invoice."
    ),
) -> None:
    """Record an expense paid after the start (egress, storage, another lot) in ledger.jsonl.

    The close and `campaign report` add it to the budget, apart from the rental; the spec is
    never edited for it.
    """
    from gpucampaign.ledger import add_expense

    entry = add_expense(out, usd=usd, what=what, order_ref=order_ref)
    ref = f" (order {entry.order_ref})" if entry.order_ref else ""
    _say(f"recorded in {out / 'ledger.jsonl'}: {entry.usd:.2f} USD for {entry.what}{ref}")


# --- status: what is off the machine, how long the rental has left -------------------------


@app.command("status")
@handle_errors
def status_cmd(out: OutFolder, as_json: AsJson = False) -> None:
    """Time left on the rental, what is in the store and what is only local, how to retrieve it."""
    from gpucampaign.status import campaign_status, render_status

    status = campaign_status(out)
    if as_json:
        print_json(status)
    else:
        console.print(render_status(status), highlight=False, markup=False, soft_wrap=True)


# --- retrieve: bring a mirrored campaign back ----------------------------------------------


@app.command("retrieve")
@handle_errors
def retrieve_cmd(
    url: str = typer.Argument(..., help="Where the campaign was mirrored: s3://bucket/prefix."),
    to: Path = typer.Option(..., "--to", help="New (or empty) folder to bring it into."),
) -> None:
    """Download a mirrored output folder, every file checked by size and sha256 (exit 2: bad
    input)."""
    from gpucampaign.mirror import retrieve_folder
    from gpucampaign.storage import StorageError, open_store, parse_s3_url

    parse_s3_url(url)
    try:
        done = retrieve_folder(open_store(url, out_dir=to, spool=False), dest=to)
    except StorageError as exc:
        raise SpecError(f"cannot retrieve {url}: {exc}", field="URL") from None
    console.print(
        f"retrieved {done['files']} files ({done['bytes']} bytes) from {url} into {to}",
        highlight=False,
    )
    console.print(f"next: campaign verify {to}", highlight=False)


def main() -> None:
    """Entry point of the ``campaign`` script."""
    app()


if __name__ == "__main__":
    main()
