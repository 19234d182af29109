"""The redactor's corpus: distinct real-world forms a credential takes (env assignments,
config lines, quoted values, URL parts, scheme-less userinfo, headers, JSON and YAML fields,
cloud and service keys, key blocks, connection strings). Each form is one entry here, counted
once: the secret is gone, and the words around it stay. Text without a credential is left
exactly as it is (no normal word redacted)."""

from __future__ import annotations

import pytest

from gpucampaign.core.text import redact_secrets

P = "Pw7Zq9Xk2Lm4"  # a password-like secret
AWS_SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"

#: (form, text, the secret in it). Every form distinct: a new entry is a new form.
CORPUS: list[tuple[str, str, str]] = [
    ("url user:password", f"http://alice:{P}@db.example:5432/x", P),
    ("url token as user", f"https://{P}@git.example/repo.git", P),
    ("url upper case", f"HTTPS://ALICE:{P}@TRACK.EXAMPLE:443", P),
    ("url percent-encoded password", f"http://alice:{P}%40%3A@host/", P),
    ("url encoded inside another", f"next=http%3A%2F%2Falice%3A{P}%40host%2F", P),
    ("postgresql connection string", f"postgresql://app:{P}@pg.internal:5432/runs", P),
    ("mysql+pymysql sqlalchemy url", f"mysql+pymysql://root:{P}@10.0.0.5/db", P),
    ("mongodb+srv url", f"mongodb+srv://svc:{P}@cluster0.mongodb.net/test", P),
    ("redis url password only", f"redis://:{P}@cache:6379/0", P),
    ("amqp url", f"amqp://guest:{P}@rabbit:5672/", P),
    ("mlflow tracking uri", f"MLFLOW_TRACKING_URI=https://u:{P}@mlflow.example", P),
    ("mlflow uri password with quote", f"https://u:{P}'x@mlflow.example/", P),
    ("prefect api url", f"PREFECT_API_URL=http://admin:{P}@prefect:4200/api", P),
    ("scheme-less user:pw@host", f"proxy alice:{P}@proxy.corp:3128 used", P),
    ("scheme-less in parentheses", f"(alice:{P}@10.1.2.3)", P),
    ("query ?token=", f"https://h/api?token={P}&page=2", P),
    ("query &access_token=", f"https://h/x?a=1&access_token={P}", P),
    ("fragment #access_token=", f"https://app/cb#access_token={P}&expires_in=3600", P),
    ("query percent-encoded name", f"https://h/?access%5Ftoken={P}", P),
    ("query api_key=", f"https://h/v1?api_key={P}#top", P),
    ("query X-Amz-Signature", f"https://b.s3/k?X-Amz-Signature={P}&X-Amz-Date=1", P),
    ("azure sas sig=", f"https://acct.blob.core.windows.net/c?sv=2020&sig={P}", P),
    ("azure AccountKey", f"DefaultEndpointsProtocol=https;AccountKey={P};Suffix=x", P),
    ("env AWS_SECRET_ACCESS_KEY=", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET),
    ("export env assignment", f"export GITHUB_TOKEN={P}", P),
    ("env PGPASSWORD=", f"PGPASSWORD={P} psql -h db", P),
    ("ini aws_secret_access_key = ", f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET),
    ("ini session token", f"aws_session_token={P}", P),
    ("pass=", f"login user=bob pass={P} ok", P),
    ("pwd=", f"connect pwd={P}", P),
    ("db_pass=", f"db_pass={P}", P),
    ("passwd=", f"passwd={P}", P),
    ("passphrase=", f"ssh passphrase={P}", P),
    ("password single-quoted", f"password='{P}'", P),
    ("password double-quoted", f'password="{P}"', P),
    ("password quoted holding a quote", f"password='{P}'b'", P),
    ("password quoted, the secret after a quote in it", f"password='a'{P}'", P),
    ("python kwarg in an error", f"connect(host='h', password='{P}', port=5)", P),
    ("client_secret=", f"client_secret={P}", P),
    ("private_key=", f"private_key={P}", P),
    ("yaml password:", f"password: {P}", P),
    ("yaml quoted secret", f"  secret: '{P}'", P),
    ("json password field", f'{{"password": "{P}", "user": "bob"}}', P),
    ("json token field no space", f'{{"token":"{P}"}}', P),
    ("json escaped quote", f'{{"api_key": "{P}\\"x"}}', P),
    ("header Authorization Bearer", f"Authorization: Bearer {P}", P),
    ("bare bearer", f"bearer {P}", P),
    ("header Basic auth", f"Authorization: Basic {P}==", P),
    ("header Token auth", f"Authorization: Token {P}", P),
    ("header x-api-key", f"x-api-key: {P}", P),
    ("header Cookie", f"Cookie: {P}", P),
    ("aws access key id", "key AKIAIOSFODNN7EXAMPLE used", "AKIAIOSFODNN7EXAMPLE"),
    ("aws temporary key id", "ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"),
    ("github classic token", "ghp_16C7e42F292c6912E7710c838347Ae178B4a", "16C7e42F292c6912E7710c"),
    (
        "github fine-grained token",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv",
        "11ABCD",
    ),
    ("slack bot token", "xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy", "pdFZKVe"),
    ("slack webhook url", "https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXX", "XXXXX"),
    ("gitlab token", "glpat-xxxxxxxxxxxxxxxxxxxx1234", "xxxxxxxxxxxxxxxxxxxx1234"),
    ("openai-style key", "sk-proj-abcdefghijklmnopqrstuvwxyz012345", "abcdefghijklmnop"),
    ("stripe live key", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("google api key", "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe", "SyDaGmWKa4JsXZ"),
    ("hugging face token", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH", "abcdefghijklmnop"),
    ("pypi token", "pypi-AgEIcHlwaS5vcmcCJGE4ZjY5YjZjLTQ2", "AgEIcHlwaS5vcmcC"),
    ("jwt", f"id_token {JWT}", JWT[40:70]),
    (
        "pem private key block",
        f"-----BEGIN RSA PRIVATE KEY-----\nMIIEow{P}IBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        P,
    ),
    (
        "openssh private key block",
        f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn{P}NzaC1\n-----END OPENSSH PRIVATE KEY-----",
        P,
    ),
]

#: Text a person reads that holds no credential: left exactly as it is.
PLAIN = [
    "http://127.0.0.1:5000/api/2.0/mlflow/runs/get?run_id=abc",
    "max_tokens=5 tokens=7 key=train/loss loss=0.25",
    "the basic recipe and the built-in mlp",
    "mailto:bob@example.com and s3://bucket/key@1",
    "the pass rate = 0.93 and compass=north, bypass=1",
    "Passed 12 of 12 checks; the password field is required",
    "token count: 512 tokens, 3 passes, keys: 4",
    "git@github.com:org/repo.git",
    "step 400: loss 0.213, lr 1e-3, seed=7, batch_size=64",
    "see https://docs.example/secrets-management for how to keep them",
    "ratio 3:2@scale is fine",
    "author=alice signal=SIGTERM design=wide",
]


def test_the_corpus_holds_at_least_fifty_distinct_forms():
    forms = [form for form, _, _ in CORPUS]
    texts = [text for _, text, _ in CORPUS]
    assert len(set(forms)) == len(forms) and len(set(texts)) == len(texts)
    assert len(set(forms)) >= 50, len(forms)


@pytest.mark.parametrize(("form", "text", "secret"), CORPUS, ids=[f for f, _, _ in CORPUS])
def test_every_form_loses_its_secret_and_keeps_its_words(form, text, secret, faults):
    faults.add("credential_forms_tried")
    said = redact_secrets(f"before {text} after")
    faults.add("secrets_leaked", int(secret in said))
    assert secret not in said, said
    assert "***" in said
    assert said.startswith("before ") and said.endswith(" after"), said


@pytest.mark.parametrize("text", PLAIN)
def test_text_without_a_credential_is_left_as_it_is(text):
    assert redact_secrets(text) == text


# --- the channels: `campaign deploy`'s own output, a recipe's exception --------------------


def test_campaign_deploy_says_no_password_of_prefect_api_url(tmp_path, monkeypatch, faults):
    """The success lines of ``campaign deploy`` name the server: never its ``user:password``.
    The registration itself is replaced (no server here); the printing is the command's."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from gpucampaign.cli import app, runner
    from gpucampaign.cli.scaffold import init_campaign

    url = f"http://admin:{P}@prefect.internal:4200/api"
    deployed = [SimpleNamespace(name="campaign/main", parameters={"spec": "s"}, crons=[])]
    monkeypatch.setattr(runner, "load_flow", lambda *a: lambda **kw: (url, deployed))
    init_campaign(tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    got = CliRunner().invoke(app, ["deploy", "mine/campaign.yaml"])
    faults.add("credential_forms_tried")
    faults.add("secrets_leaked", int(P in got.output))
    assert got.exit_code == 0, got.output
    assert P not in got.output and "deployed campaign/main" in got.output
    assert "prefect.internal:4200" in got.output


def test_a_recipes_exception_says_no_password_to_the_terminal_or_prefect(caplog, faults):
    """A recipe method raising with ``password='...'`` in its text (a quote inside it): the
    error the CLI prints, the Failed state Prefect records for the task and the traceback its
    log keeps (the cause included) say no password."""
    import asyncio
    import logging

    from prefect.states import exception_to_failed_state

    from gpucampaign.cli.common import _said
    from gpucampaign.core.text import redact_logging
    from gpucampaign.recipe.contract import RecipeError, call

    def datasets() -> None:
        raise ValueError(f"could not connect(host='db', password='{P}'b', port=5432)")

    with pytest.raises(RecipeError) as raised:
        call("mine:Recipe", "datasets", datasets)
    exc = raised.value
    state = asyncio.run(exception_to_failed_state(exc))
    redact_logging()
    with caplog.at_level(logging.ERROR, logger="prefect.task_runs"):
        logging.getLogger("prefect.task_runs").error("Task run failed", exc_info=exc)
    said = [_said(exc), str(state.message), caplog.text, repr(exc.__cause__)]
    faults.add("credential_forms_tried")
    faults.add("secrets_leaked", int(any(P in s for s in said)))
    assert not any(P in s for s in said), said
    assert "datasets()" in said[0] and "host='db'" in said[1] and "port=5432" in said[2]
