"""Credentials from the attacker's side: a tracking server's secret in every form it takes
(``user:password@``, a token alone as the user part, token parameters, bearer values; in upper
and lower case, percent-encoded) never reaches the terminal, a log record (ours, mlflow's,
Prefect's), an error message or a file of the output folder; bad tracking URIs are refused
before anything starts; and ``campaign track`` talks only to the server the user chose, never
handing the environment's credentials to a server a folder names."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucampaign.cli import app
from gpucampaign.config import SpecError, check_tracking_uri
from gpucampaign.core.text import redact_logging, redact_secrets
from gpucampaign.folder.layout import MLFLOW_OUTBOX_FILE, MLFLOW_STATE_FILE
from gpucampaign.tracking.mlflow import RunTracker, short_error
from tests.faults.conftest import URI_SECRET
from tests.helpers import reseal
from tests.helpers.fake_mlflow import FakeClient

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "campaign.yaml"
SECRET = URI_SECRET  # the canary ("Pw7Zq9Xk2Lm4"): found anywhere, it leaked
runner = CliRunner()

# Every form a credential takes in a URI or a text, the secret inside it.
FORMS = {
    "user:password@": f"http://alice:{SECRET}@127.0.0.1:9",
    "USER:PASSWORD@": f"HTTPS://ALICE:{SECRET}@TRACK.EXAMPLE:443",
    "token@": f"https://{SECRET}@127.0.0.1:9",
    "percent-encoded password": f"http://alice:{SECRET}%40%3A%2F@127.0.0.1:9",
    "password with @": f"http://alice:{SECRET}@x@127.0.0.1:9",
    "?access_token=": f"https://127.0.0.1:9/?access_token={SECRET}",
    "?TOKEN=": f"https://127.0.0.1:9/api?TOKEN={SECRET}&x=1",
    "&password=": f"http://127.0.0.1:9/?a=1&password={SECRET}",
    "percent-encoded name": f"http://127.0.0.1:9/?access%5Ftoken={SECRET}",
    "api_key=": f"http://127.0.0.1:9/?api_key={SECRET}#top",
    "Bearer": f"Authorization: Bearer {SECRET}",
    "bearer": f"bearer {SECRET}",
    "Basic": f"Authorization: Basic {SECRET}==",
    "encoded URL": f"next=http%3A%2F%2Falice%3A{SECRET}%40host%2F",
    "password holding a quote": f"http://alice:{SECRET}'x@127.0.0.1:9",
    "password starting with a quote": f"http://alice:'{SECRET}@127.0.0.1:9",
}
# What stays as it is: no credential in it.
PLAIN = [
    "http://127.0.0.1:5000/api/2.0/mlflow/runs/get?run_id=abc",
    "max_tokens=5 tokens=7 key=train/loss loss=0.25",
    "the basic recipe and the built-in mlp",
    "mailto:bob@example.com and s3://bucket/key@1",
]


def _leaked(text: str) -> bool:
    return SECRET.lower() in text.lower()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_is_redacted_in_any_text(form, faults):
    faults.add("credential_forms_tried")
    text = f"error: request to {FORMS[form]} failed (and again: {FORMS[form]})"
    said = redact_secrets(text)
    leaked = _leaked(said)
    faults.add("secrets_leaked", int(leaked))
    assert not leaked, said
    assert "***" in said and said.startswith("error: request to ")


@pytest.mark.parametrize("text", PLAIN)
def test_text_without_a_credential_is_left_as_it_is(text):
    assert redact_secrets(text) == text


@pytest.mark.parametrize("form", sorted(FORMS))
def test_no_log_record_says_a_credential(form, faults, caplog, capsys):
    """Ours, mlflow's and Prefect's loggers, a message's arguments and a traceback's text:
    what any handler (the terminal, Prefect's records of a run) gets is redacted."""
    faults.add("credential_forms_tried")
    redact_logging()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(self.format(record))

    from prefect.logging.formatters import JsonFormatter

    handler, as_json = Keep(), Keep()
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    as_json.setFormatter(JsonFormatter("default", "", "%"))  # reads the exception raw
    names = ("gpucampaign.tracking.mlflow", "mlflow.tracking", "prefect.task_runs", "urllib3")
    for name in names:
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).addHandler(as_json)
    try:
        for name in names:
            log = logging.getLogger(name)
            log.warning("server %s does not answer", FORMS[form])
            try:
                raise ConnectionError(f"API request to {FORMS[form]} failed")
            except ConnectionError as exc:
                failed = exc
            log.error("failed", exc_info=failed)  # its traceback's text, redacted too
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).removeHandler(as_json)
    out = capsys.readouterr()
    texts = [*seen, caplog.text, out.out, out.err]
    leaks = [t for t in texts if _leaked(t)]
    faults.add("secrets_leaked", len(leaks))
    assert leaks == []
    assert len(seen) == 4 * len(names) and all("***" in t for t in seen)


URL_FORMS = {k: v for k, v in FORMS.items() if v.lower().startswith("http")}


@pytest.mark.parametrize("form", sorted(URL_FORMS))
def test_the_spec_refuses_a_credential_in_the_uri_without_repeating_it(form, faults):
    faults.add("credential_forms_tried")
    for uri in (FORMS[form], f" {FORMS[form]}", f"\t{FORMS[form]} \n"):  # spaces hide nothing
        with pytest.raises(ValueError) as info:
            check_tracking_uri(uri)
        assert not _leaked(str(info.value))
    from gpucampaign.config.parts import MlflowSpec

    with pytest.raises(Exception) as info:
        MlflowSpec(uri=f" {FORMS[form]}")
    said = str(SpecError(str(info.value)))
    faults.add("secrets_leaked", int(_leaked(said)))
    assert not _leaked(said)


def test_the_leading_space_does_not_hide_a_password():
    from gpucampaign.config.parts import MlflowSpec

    with pytest.raises(ValueError, match="holds credentials"):
        MlflowSpec(uri=f" http://u:{SECRET}@h:5000")
    assert MlflowSpec(uri="  http://h:5000 ").uri == "http://h:5000"  # kept as normalized


@pytest.mark.parametrize("form", sorted(URL_FORMS))
def test_a_run_tracker_writes_and_says_no_credential(tmp_path, form, faults, caplog):
    """A server that does not answer: its warning, the run's mlflow.json, its outbox and the
    line the task logs hold no credential of the URI (the client alone has it)."""
    from gpucampaign.tracking.mlflow import tracking_note

    faults.add("credential_forms_tried")
    fake = FakeClient()
    fake.down = True
    folder = tmp_path / "runs" / "control-abc"
    folder.mkdir(parents=True)
    t = RunTracker(
        client=fake,
        uri=FORMS[form],
        experiment="exp",
        campaign_id="c-1",
        run_folder=folder,
        run_id="control-abc",
        tags={},
        params={},
    )
    with caplog.at_level(logging.INFO):
        t.start()  # writes mlflow.json, then its thread sends (and fails)
        t.write({"kind": "train", "step": 1, "loss": 0.5, "lr": 0.1})
        assert t.close("FINISHED", wait_s=10)["pending"] == 2
    texts = [caplog.text, tracking_note(folder) or "", short_error(ConnectionError(FORMS[form]))]
    texts += [p.read_text() for p in sorted(tmp_path.rglob("*")) if p.is_file()]
    leaks = [t for t in texts if _leaked(t)]
    faults.add("secrets_leaked", len(leaks))
    assert leaks == []
    assert (folder / MLFLOW_STATE_FILE).is_file() and (folder / MLFLOW_OUTBOX_FILE).is_file()


USERINFO_FORMS = [k for k in URL_FORMS if "?" not in FORMS[k] and "#" not in FORMS[k]]


@pytest.mark.parametrize("form", USERINFO_FORMS)
def test_mlflows_own_client_says_no_credential(tmp_path, form, faults, caplog, capfd):
    """The real MlflowClient against a server that does not answer, its URI holding the
    credential (as MLFLOW_TRACKING_URI may): what it logs or prints, and the run's files,
    hold none of it."""
    from gpucampaign.tracking.mlflow import make_client

    faults.add("credential_forms_tried")
    folder = tmp_path / "runs" / "control-abc"
    folder.mkdir(parents=True)
    with caplog.at_level(logging.DEBUG):
        t = RunTracker(
            client=make_client(FORMS[form]),
            uri=FORMS[form],
            experiment="exp",
            campaign_id="c-1",
            run_folder=folder,
            run_id="control-abc",
            tags={},
            params={},
        )
        t.start()
        t.write({"kind": "eval", "step": 1, "split": "val", "accuracy": 0.5})
        t.close("FINISHED", wait_s=60)
    out = capfd.readouterr()
    texts = [caplog.text, out.out, out.err, str(t.error)]
    texts += [p.read_text() for p in sorted(tmp_path.rglob("*")) if p.is_file()]
    leaks = [x for x in texts if _leaked(x)]
    faults.add("secrets_leaked", len(leaks))
    assert leaks == []
    assert t.down and caplog.records


def test_a_cut_error_does_not_hide_a_password_by_cutting_it():
    exc = ConnectionError("x" * 180 + f" http://alice:{SECRET}@127.0.0.1:9/api/2.0/mlflow")
    assert not _leaked(short_error(exc))


# --- campaign plan: the environment's URI and the spec's, each form and each bad scheme ------
def _plan(tmp_path: Path, monkeypatch, *, env_uri: str | None = None, spec_uri: str | None = None):
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE.parent, src)
    if spec_uri is not None:
        with (src / "campaign.yaml").open("a") as f:
            f.write(f"tracking: {{mlflow: {{uri: {json.dumps(spec_uri)}}}}}\n")
    with monkeypatch.context() as m:
        m.delenv("GPUCAMPAIGN_TRACKING", raising=False)
        if env_uri is None:
            m.delenv("MLFLOW_TRACKING_URI", raising=False)
        else:
            m.setenv("MLFLOW_TRACKING_URI", env_uri)
        return runner.invoke(app, ["plan", str(src / "campaign.yaml")])


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(URL_FORMS))
def test_plan_says_no_credential_of_either_uri(tmp_path, monkeypatch, form, faults):
    faults.add("credential_forms_tried")
    as_env = _plan(tmp_path / "env", monkeypatch, env_uri=FORMS[form])
    in_spec = _plan(tmp_path / "spec", monkeypatch, spec_uri=" " + FORMS[form])
    leaked = _leaked(as_env.output) + _leaked(in_spec.output)
    faults.add("secrets_leaked", leaked)
    assert not leaked
    assert in_spec.exit_code == 2 and "tracking.mlflow.uri" in in_spec.output
    assert "Traceback" not in as_env.output + in_spec.output
    if "?" in FORMS[form] or "#" in FORMS[form]:
        assert as_env.exit_code == 2 and "MLFLOW_TRACKING_URI" in as_env.output
    else:  # a user part in the environment's URI is the environment's credential: kept there
        assert as_env.exit_code == 0, as_env.output


BAD_URIS = ["file:///tmp/mlruns", "file:mlruns", "mlruns", "./mlruns", "ftp://h/mlruns"]
BAD_URIS += ["sqlite:///mlflow.db", "http://", "http://h:99999", "http://h:5000 x"]


@pytest.mark.slow
@pytest.mark.parametrize("uri", BAD_URIS)
def test_plan_refuses_a_uri_that_is_not_a_tracking_server(tmp_path, monkeypatch, uri, faults):
    """Once these passed `plan` and crashed the pilot with a traceback and a partial folder."""
    for where in ("spec", "env"):
        res = _plan(tmp_path / where, monkeypatch, **{f"{where}_uri": uri})
        faults.add("preflight_refusals")
        assert res.exit_code == 2, res.output
        field = "tracking.mlflow.uri" if where == "spec" else "MLFLOW_TRACKING_URI"
        assert field in " ".join(res.output.split()) and "Traceback" not in res.output
        assert not (tmp_path / where / "out").exists()


# --- campaign track: the user's server only, the folder's only when asked ----------------------
class _Recorder(BaseHTTPRequestHandler):
    """A tracking server that records every request and its Authorization header, and
    answers each with 503 (so `track` stops at its first request and says so)."""

    def _answer(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        if size:
            self.rfile.read(size)
        self.server.seen.append(  # type: ignore[attr-defined]
            (self.command, self.path, self.headers.get("Authorization"))
        )
        body = b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "recorder"}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers():
    """Two recording servers: ``mine`` (the user's) and ``theirs`` (a folder names it)."""
    made = {}
    for name in ("mine", "theirs"):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        srv.seen = []  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
        made[name] = srv
    yield {k: (f"http://127.0.0.1:{s.server_address[1]}", s.seen) for k, s in made.items()}
    for s in made.values():
        s.shutdown()
        s.server_close()


def _tracked_folder(out: Path, *, mine: str, named: str | None, seal_tracking: bool) -> None:
    """``out`` (a closed folder) as if its runs had been tracked, its spec naming ``named``;
    resealed as an attacker would (the file list; the tracking section too when asked)."""
    rid = next(p.name for p in sorted((out / "runs").iterdir()) if p.is_dir())
    state = {"run_id": rid, "uri": mine, "experiment": "exp", "campaign_id": "c-1"}
    (out / "runs" / rid / MLFLOW_STATE_FILE).write_text(
        json.dumps({**state, "tags": {}, "params": {}})
    )
    (out / "runs" / rid / MLFLOW_OUTBOX_FILE).write_text(
        json.dumps(["train/loss", 0.5, 1, 1]) + "\n"
    )
    if named is not None:
        with (out / "spec.yaml").open("a") as f:
            f.write(f"tracking: {{mlflow: {{uri: '{named}'}}}}\n")
    if seal_tracking:
        m = json.loads((out / "manifest.json").read_text())
        m["tracking"] = {"mlflow": None if named is None else {"uri": named, "experiment": None}}
        (out / "manifest.json").write_text(json.dumps(m))
    reseal(out)


@pytest.fixture
def user_env(monkeypatch, servers):
    mine = servers["mine"][0]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mine)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    monkeypatch.delenv("GPUCAMPAIGN_TRACKING", raising=False)
    monkeypatch.setenv("HOME", str(Path(os.environ.get("TMPDIR", "/tmp"))))  # no creds file
    return mine


def test_track_talks_only_to_the_users_server(out, servers, user_env, faults):
    """The folder (sealed, its manifest rewritten to match) names another server: `track`
    says so, and sends to the user's server alone, with the user's credentials."""
    theirs, their_seen = servers["theirs"]
    _, my_seen = servers["mine"]
    _tracked_folder(out, mine=user_env, named=theirs, seal_tracking=True)
    res = runner.invoke(app, ["track", str(out)])
    faults.add("credential_forms_tried")
    faults.add("secrets_leaked", int(bool(their_seen)))
    assert their_seen == [], their_seen
    assert my_seen and all(auth and auth.startswith("Basic ") for _, _, auth in my_seen)
    assert res.exit_code == 1, res.output  # the recorder answers 503: nothing is lost
    text = " ".join(res.output.split())
    assert theirs in text and "not used" in text and "--folder-uri" in text
    assert not _leaked(res.output)


def test_the_folders_server_only_when_asked_and_without_the_users_credentials(
    out, servers, user_env, faults
):
    theirs, their_seen = servers["theirs"]
    _, my_seen = servers["mine"]
    _tracked_folder(out, mine=user_env, named=theirs, seal_tracking=True)
    res = runner.invoke(app, ["track", str(out), "--folder-uri"])
    faults.add("credential_forms_tried")
    leaked = [auth for _, _, auth in their_seen if auth]
    faults.add("secrets_leaked", len(leaked))
    assert my_seen == [] and their_seen and leaked == [], their_seen
    assert res.exit_code == 1, res.output
    assert "without the MLflow credentials" in " ".join(res.output.split())
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == SECRET  # given back after the command


def test_the_folders_server_gets_the_credentials_when_it_is_the_users(out, servers, user_env):
    _, my_seen = servers["mine"]
    _tracked_folder(out, mine=user_env, named=user_env, seal_tracking=True)
    res = runner.invoke(app, ["track", str(out), "--folder-uri"])
    assert res.exit_code == 1, res.output
    assert my_seen and all(auth and auth.startswith("Basic ") for _, _, auth in my_seen)


def test_a_credential_on_the_command_line_is_refused(out, servers, user_env):
    res = runner.invoke(app, ["track", str(out), "--uri", f"http://bob:{SECRET}@127.0.0.1:9"])
    assert res.exit_code == 2 and not _leaked(res.output), res.output
    assert servers["mine"][1] == [] and servers["theirs"][1] == []


def test_a_tracking_section_edited_after_the_seal_is_refused(out, servers, user_env, faults):
    """The spec's tracking server changed and the file list resealed (its hash is not in
    spec_sha256): `verify` names it and `track` sends nothing (exit 4)."""
    from gpucampaign.verify.checks import verify_output

    theirs, their_seen = servers["theirs"]
    _tracked_folder(out, mine=user_env, named=theirs, seal_tracking=False)
    report = verify_output(out, reload=False)
    assert [(p.code, p.path) for p in report.problems] == [("spec_changed", "spec.yaml")]
    for args in (["track", str(out)], ["track", str(out), "--folder-uri"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 4, res.output
        assert "spec_changed spec.yaml" in res.output and "nothing was sent" in res.output
    assert their_seen == [] and servers["mine"][1] == []


@pytest.mark.process
def test_verify_exits_4_on_a_tracking_section_edited_after_the_seal(out, servers):
    _tracked_folder(out, mine=servers["mine"][0], named=servers["theirs"][0], seal_tracking=False)
    res = runner.invoke(app, ["verify", str(out)])
    assert res.exit_code == 4 and "spec_changed" in res.output, res.output


# --- a real campaign with a credential in the environment's URI -----------------------------
@pytest.mark.slow
@pytest.mark.process
def test_campaign_run_keeps_the_uri_credential_out_of_everything(secret_campaign, faults):
    """`campaign run` with ``MLFLOW_TRACKING_URI=http://alice:SECRET@host`` (a server that does
    not answer) and the secret in MLFLOW_TRACKING_PASSWORD: the terminal, every file of the
    output folder (mlflow.json included) and Prefect's database hold it nowhere. (The session's
    ``secret_campaign``, run once with this secret and test_security's canaries.)"""
    out, home, said = secret_campaign
    faults.add("credential_forms_tried")
    leaks = [f"terminal: {line}" for line in said.splitlines() if _leaked(line)]
    for root in (out, home):
        leaks += [
            str(p)
            for p in sorted(root.rglob("*"))
            if p.is_file() and SECRET.encode() in p.read_bytes()
        ]
    faults.add("secrets_leaked", len(leaks))
    assert leaks == []
    assert "does not answer" in said  # the warnings were there, redacted
    assert list(out.glob("runs/*/mlflow.json")) and any(p.suffix == ".db" for p in home.rglob("*"))
