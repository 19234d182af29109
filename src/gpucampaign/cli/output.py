"""The ``campaign`` commands on an output folder: verify, report, expense, status, watch,
track, retrieve.

They are registered on the one ``app`` of ``cli/common.py`` when ``cli`` imports this module.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import typer

from gpucampaign.cli.common import (
    EXIT_NOT_FIT,
    EXIT_UNEXPECTED,
    AsJson,
    OutFolder,
    app,
    console,
    esc,
    handle_errors,
    print_json,
    say,
)
from gpucampaign.config import SpecError
from gpucampaign.core.errors import ArgumentError, FolderError
from gpucampaign.folder.layout import LEDGER_FILE, MANIFEST, PLAN, SPEC_COPY

# --- close: verify and report an output folder ----------------------------------------------


@app.command("verify")
@handle_errors
def verify_cmd(
    out: OutFolder,
    as_json: AsJson = False,
    no_reload: bool = typer.Option(
        False, "--no-reload", help="Skip reloading the models (then the folder is NOT verified)."
    ),
    expect: str | None = typer.Option(
        None,
        "--expect",
        metavar="SHA256",
        help="The manifest's sha256 printed at the close and kept outside the folder: another "
        "one fails (exit 4); the same one anchors the folder, so its copies of recipe code may "
        "run to reload its models.",
    ),
    trust_folder_code: bool = typer.Option(
        False,
        "--trust-folder-code",
        help="Import the recipe code kept in the folder without --expect (a folder you trust).",
    ),
    recipes: list[Path] = typer.Option(  # noqa: B008
        [],
        "--recipes",
        metavar="DIR",
        help="A folder of your recipe files (the spec's folder): they reload the models when "
        "they have the recorded sha256.",
    ),
) -> None:
    """Check an output folder against its manifest, reload every model: exit 0 verified, 4 not.

    No code of the folder runs unless its manifest is anchored (--expect) or you trust it
    (--trust-folder-code); a model whose recipe is found nowhere else is not reloaded, and
    the output says so.
    """
    from gpucampaign.verify.checks import verify_output

    if not out.is_dir():
        raise FolderError(f"'{out}' is not a folder: give a campaign's output folder.", field="OUT")
    if not any((out / name).is_file() for name in (MANIFEST, SPEC_COPY, PLAN)):
        # Not a campaign's folder (a home folder, '/'): refused rather than walked.
        raise FolderError(
            f"'{out}' is not a campaign output folder (no manifest.json, spec.yaml or "
            "plan.json): give the folder that `campaign run --out` wrote.",
            field="OUT",
        )
    if expect is not None and not _SHA256.fullmatch(expect.strip().lower()):
        raise ArgumentError(
            "--expect takes the manifest's sha256 printed at the close: 64 hexadecimal characters.",
            field="--expect",
        )
    for folder in recipes:
        if not folder.is_dir():
            raise ArgumentError(f"--recipes '{folder}' is not a folder.", field="--recipes")
    report = verify_output(
        out,
        reload=not no_reload,
        expect=expect,
        trust_folder_code=trust_folder_code,
        recipe_dirs=recipes,
    )
    verified = report.verified and not no_reload
    if as_json:
        print_json({**report.to_dict(), "verified": verified, "reload_skipped": no_reload})
    else:
        _print_verify(report, out=out, verified=verified, no_reload=no_reload)
    if not verified:
        raise typer.Exit(EXIT_NOT_FIT)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _print_verify(report: Any, *, out: Path, verified: bool, no_reload: bool) -> None:
    for p in report.problems:
        say(f"[red]{p.code}[/] {esc(p.path)}: {esc(p.detail)}")
    for reason in report.skipped:
        say(f"[yellow]skipped:[/] {esc(reason)}")
    if no_reload:
        console.print("[yellow]models were not reloaded (--no-reload): not a verified output[/]")
    if report.anchored:
        say(f"manifest.json sha256 {report.manifest_sha256}: as expected (--expect)")
    elif report.anchored is None and report.manifest_sha256:
        say(
            f"manifest.json sha256 {report.manifest_sha256}: compare it with the one printed "
            "at the close, or give it as --expect"
        )
    state = (
        "[green]verified[/]"
        if verified
        else f"[red]NOT verified[/] ({len(report.problems)} problem(s))"
    )
    # "verified" with a model not reloaded says so on the same line, not only above it.
    not_reloaded = sum(" not reloaded: " in reason for reason in report.skipped)
    rest = f", {not_reloaded} not reloaded (each named above, with why)" if not_reloaded else ""
    say(
        f"{esc(out)}: {state}; {report.checked_files} files checked, "
        f"{len(report.reloaded_runs)} model(s) reloaded and reproduced{rest}"
    )


@app.command("report")
@handle_errors
def report_cmd(out: OutFolder, as_json: AsJson = False) -> None:
    """Print the closing report (report.json, its verdict recomputed from the folder's records,
    rendered now); the budget adds the expenses recorded by `campaign expense` since."""
    from rich.markdown import Markdown

    from gpucampaign.close.budget import render_budget_md
    from gpucampaign.close.ledger import budget_with_ledger
    from gpucampaign.close.report import read_report, report_summary, with_budget
    from gpucampaign.folder.layout import REPORT_MD, OutputFolder
    from gpucampaign.verify.verdict import readable_report

    OutputFolder(out).path(REPORT_MD)  # a report.md linking out of the folder is refused
    if (out / SPEC_COPY).is_file() and not (out / MANIFEST).is_file():
        raise FolderError(
            f"'{out}' holds a campaign that has not closed (no {MANIFEST}): it is running, or "
            f"stopped before its close. Follow it with `campaign watch {out}`; its report is "
            "written at the close (a stopped campaign closes when it is run again).",
            field="OUT",
        )
    report = read_report(out)
    # The verdict recomputed from the folder's records, and report.md generated now from it:
    # the kept report.md is never printed (a forged headline in it is never shown).
    verdict, text, warning = readable_report(out, report)
    report = {**report, "verdict": verdict}
    budget = budget_with_ledger(out, report["budget"])
    changed = budget["expenses"] != report["budget"].get("expenses")
    report = with_budget(report, budget)
    if as_json:
        print_json({**report_summary(report), **({"warning": warning} if warning else {})})
        return
    if warning:
        console.print(f"[red]{esc(warning)}[/]")
    console.print(Markdown(text))
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
    from gpucampaign.close.ledger import add_expense

    entry = add_expense(out, usd=usd, what=what, order_ref=order_ref)
    ref = f" (order {entry.order_ref})" if entry.order_ref else ""
    say(f"recorded in {esc(out / LEDGER_FILE)}: {entry.usd:.2f} USD for {esc(entry.what + ref)}")


# --- status: what is off the machine, how long the rental has left -------------------------


@app.command("status")
@handle_errors
def status_cmd(out: OutFolder, as_json: AsJson = False) -> None:
    """Time left on the rental, what is in the store and what is only local, how to retrieve
    it, and the goodput so far."""
    from gpucampaign.close.goodput import live_goodput
    from gpucampaign.storage.status import campaign_status, render_status

    status = campaign_status(out)
    status["goodput"] = live_goodput(out)
    if as_json:
        print_json(status)
    else:
        text = render_status(status)
        if status["goodput"] is not None:
            text += "\n" + status["goodput"]["line"]
        console.print(text, highlight=False, markup=False, soft_wrap=True)


# --- watch: the live view of a campaign from another terminal ---------------------------------


def campaign_closed(out: Path) -> bool:
    """True once the campaign's close sealed the folder after its last training progress."""
    from gpucampaign.folder.layout import MANIFEST
    from gpucampaign.folder.progress import read_all_progress, updated_at

    manifest = out / MANIFEST
    if not manifest.is_file():
        return False
    records = read_all_progress(out)
    newest = max((updated_at(r) for r in records), default=0.0)
    return manifest.stat().st_mtime >= newest


#: How long `campaign watch` waits for a campaign that is starting (its checks, its server).
WATCH_WAIT_S = 60.0


def _started_campaign(out: Path, *, wait_s: float) -> Any:
    """The spec of the campaign in ``out``, waiting up to ``wait_s`` for a `campaign run` that
    is starting to make the folder its own (said once).

    Raises:
        FolderError: ``out`` is still no campaign's folder after the wait.
    """
    from gpucampaign.core import clock
    from gpucampaign.storage.status import campaign_folder_spec

    deadline = clock.monotonic() + wait_s
    said = False
    while True:
        try:
            return campaign_folder_spec(out)
        except FolderError as exc:
            if clock.monotonic() >= deadline:
                if said:
                    raise FolderError(f"{exc} (waited {wait_s:g} s)", field="OUT") from None
                raise
        if not said:
            say(
                f"waiting up to {wait_s:g} s for {esc(out)} to become a campaign's output "
                "folder (a `campaign run` starting checks its spec first; --wait sets the wait)"
            )
            said = True
        clock.sleep(0.5)


@app.command("watch")
@handle_errors
def watch_cmd(
    out: OutFolder,
    every: float = typer.Option(
        30.0, "--every", help="Without a terminal: seconds between two lines of a phase.", min=0.1
    ),
    once: bool = typer.Option(False, "--once", help="Print the current lines and exit."),
    wait: float | None = typer.Option(
        None,
        "--wait",
        min=0,
        help="Seconds to wait for OUT to become a campaign's folder (a `campaign run` that is "
        f"starting checks its spec first): {WATCH_WAIT_S:g} by default, 0 with --once.",
    ),
) -> None:
    """The live progress of a campaign, read from its output folder, until it closes (Ctrl-C
    ends the watch, never the campaign)."""
    from gpucampaign.cli.progress import LiveView, follow
    from gpucampaign.plan.rental import rental_of

    if wait is None:  # a look (--once) says what is there now; a watch waits for a start
        wait = 0.0 if once else WATCH_WAIT_S
    spec = _started_campaign(out, wait_s=wait)  # exit 2 when it is no campaign's folder
    rental = rental_of(spec)
    view = LiveView(out, console=console, ends_at=rental.ends_at if rental else None, every_s=every)
    say(f"watching {esc(spec.name)} in {esc(out)} (Ctrl-C ends the watch, not the campaign)")
    try:
        follow(view, until=lambda: once or campaign_closed(out))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if campaign_closed(out):
        say(f"the campaign is closed: `campaign report {esc(out)}`")


# --- track: send to MLflow what a closed campaign kept back ----------------------------------


@app.command("track")
@handle_errors
def track_cmd(
    out: OutFolder,
    uri: str | None = typer.Option(
        None,
        "--uri",
        help="The MLflow tracking server to send to (else MLFLOW_TRACKING_URI); credentials "
        "come from the environment only (MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN).",
    ),
    folder_uri: bool = typer.Option(
        False,
        "--folder-uri",
        help="Send to the server the folder's spec.yaml names (tracking.mlflow.uri) instead; "
        "the environment's credentials go with it only when they are for that same server.",
    ),
    as_json: AsJson = False,
) -> None:
    """Send to MLflow what a closed campaign kept while its tracking server was down (the runs'
    mlflow-outbox.jsonl, the verdict and budget tags, the report): exit 0 all sent, 1 the
    server does not answer (run it again later). The folder is read, never written, and only
    what the server lacks is sent: running it twice sends nothing twice. The server is yours
    (--uri, else MLFLOW_TRACKING_URI); the one the folder names only with --folder-uri."""
    from gpucampaign.core.text import redact_secrets
    from gpucampaign.folder.layout import MANIFEST
    from gpucampaign.storage.status import campaign_folder_spec
    from gpucampaign.tracking import sealed_tracking_uri, track_sealed
    from gpucampaign.tracking.campaign import folder_tracking_uri

    spec = campaign_folder_spec(out)  # exit 2 when it is not a campaign's folder
    if uri is not None and folder_uri:
        raise ArgumentError(
            "--uri and --folder-uri name two servers: give one of them.", field="--folder-uri"
        )
    if uri is not None:
        _check_tracking_uri(uri, field="--uri", credentials=False)
    elif not folder_uri and (env_uri := os.environ.get("MLFLOW_TRACKING_URI")):
        _check_tracking_uri(env_uri, field="MLFLOW_TRACKING_URI", credentials=True)
    if not (out / MANIFEST).is_file():
        raise FolderError(
            f"'{out}' has no {MANIFEST}: the campaign is not closed. A campaign that runs sends "
            "what it kept at its runs' next start and at its close; `campaign track` is for a "
            "closed (sealed) folder.",
            field="OUT",
        )
    target = sealed_tracking_uri(spec, root=out, uri=uri, folder_uri=folder_uri)
    _check_sealed(out, what="its tracking records", spec=spec)
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    named = folder_tracking_uri(spec)
    if named is not None and not folder_uri and not as_json:
        say(
            f"the folder's spec names the tracking server {redact_secrets(named)}: not used; "
            f"sending to {redact_secrets(target)} (--folder-uri sends to the folder's)"
        )
    line, done = track_sealed(spec, root=out, manifest=manifest, uri=uri, folder_uri=folder_uri)
    line = redact_secrets(line)
    if as_json:
        print_json({"out": str(out), "tracked": done, "line": line, "folder_uri": named})
    else:
        say(esc(line))
    if not done:
        if not as_json:
            say(
                f"nothing is lost: {esc(out)} still holds it; run `campaign track {esc(out)}` again"
            )
        raise typer.Exit(EXIT_UNEXPECTED)


def _check_tracking_uri(uri: str, *, field: str, credentials: bool) -> None:
    """A tracking URI as ``check_tracking_uri`` takes it (``credentials``: a user part may be
    in it, as in ``MLFLOW_TRACKING_URI``), else exit 2 naming ``field``."""
    from gpucampaign.config import check_tracking_uri

    try:
        check_tracking_uri(uri, credentials=credentials)
    except ValueError as exc:
        raise SpecError(f"{field} '{uri}': {exc}.", field=field) from None


def _check_sealed(out: Path, *, what: str, spec: Any = None) -> None:
    """The folder against its manifest before anything of it is trusted (exit 4 naming each
    file that differs), as ``retrieve`` checks what it brought back; with ``spec`` (the
    folder's), its tracking section too: ``track`` reads it."""
    from gpucampaign.verify.checks import seal_problems, tracking_problems

    problems = seal_problems(out)
    if not problems and spec is not None:  # the manifest reads: the seal checks said so
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        problems += tracking_problems(spec, manifest=manifest)
    for p in problems:
        say(f"[red]{p.code}[/] {esc(p.path)}: {esc(p.detail)}")
    if problems:
        say(
            f"[red]{esc(out)} is NOT the folder its manifest sealed[/] "
            f"({len(problems)} problem(s)): "
            f"{what} are not trusted; nothing was sent."
        )
        raise typer.Exit(EXIT_NOT_FIT)


# --- retrieve: bring a mirrored campaign back ----------------------------------------------


@app.command("retrieve")
@handle_errors
def retrieve_cmd(
    url: str = typer.Argument(..., help="Where the campaign was mirrored: s3://bucket/prefix."),
    to: Path = typer.Option(..., "--to", help="New (or empty) folder to bring it into."),
) -> None:
    """Download a mirrored output folder, every file checked by size and sha256 (exit 2: bad
    input)."""
    from gpucampaign.storage import StorageError, open_store, parse_s3_url
    from gpucampaign.storage.mirror import retrieve_folder

    parse_s3_url(url)
    try:
        done = retrieve_folder(open_store(url, out=to, spool=False), dest=to)
    except StorageError as exc:
        raise ArgumentError(f"cannot retrieve {url}: {exc}", field="URL") from None
    console.print(
        f"retrieved {done['files']} files ({done['bytes']} bytes) from {url} into {to}",
        highlight=False,
        markup=False,
    )
    _check_retrieved(to)
    say(f"next: campaign verify {esc(to)}")


def _check_retrieved(to: Path) -> None:
    """Every retrieved file against the folder's manifest, before anything of it is trusted:
    a bucket someone else wrote is named file by file (exit 4) and nothing of it runs."""
    from gpucampaign.folder.layout import MANIFEST
    from gpucampaign.verify.checks import seal_problems

    if not (to / MANIFEST).is_file():
        say(
            f"{esc(to)} has no {MANIFEST} (the campaign was not sealed): "
            "nothing to check it against"
        )
        return
    problems = seal_problems(to)
    for p in problems:
        say(f"[red]{p.code}[/] {esc(p.path)}: {esc(p.detail)}")
    if problems:
        say(
            f"[red]{esc(to)} is NOT the folder its manifest sealed[/] "
            f"({len(problems)} problem(s)): "
            "do not reload its models or import its recipe copies."
        )
        raise typer.Exit(EXIT_NOT_FIT)
    say(f"every file of {esc(to)} has the size and sha256 its manifest.json records")
