"""How text is said to a person (reports, the decision point, the CLI): durations, and text
from elsewhere made safe to show (no terminal escapes, no password of a URL)."""

from __future__ import annotations

import logging
import re
import traceback
import unicodedata
from collections.abc import Callable
from typing import Any


def say_hours(hours: float | None, *, signed: bool = False, missing: str = "") -> str:
    """A duration with the precision it deserves: ``42 s``, ``12.5 min``, ``3.05 h``."""
    if hours is None:
        return missing
    sign = "+" if signed and hours >= 0 else ("-" if hours < 0 else "")
    h = abs(hours)
    if h * 3600 < 59.95:
        return f"{sign}{h * 3600:.3g} s"
    if h < 1:
        return f"{sign}{h * 60:.3g} min"
    return f"{sign}{h:.3g} h"


# Every form a credential takes in a URL, an error text, a config line or a log, each replaced
# by ``***`` (tests/faults/test_redaction_corpus.py holds the corpus of forms): the whole user
# part of a URL (``user:password@``, a token alone: ``TOKEN@``; a URL percent-encoded inside
# another too) ...
_URL_USERINFO = re.compile(
    r"(?i)\b([a-z][a-z0-9+.-]*(?::|%3a)(?://|%2f%2f))"
    r"(?:[^/?#\s\"<>]+@|[^/?#@\s'\"<>]+?%40)"  # a quote in a password too
)
# ... the password of a scheme-less ``user:password@host`` (a connection string, a proxy) ...
_BARE_USERINFO = re.compile(
    r"(?i)(?<![\w/:.@%-])(?!mailto:)([a-z_][a-z0-9_.+-]*:)[^\s:/@\"<>]+(?=@[a-z0-9[])"
)
# ... a value whose name ends in a secret's word (``?access_token=``, ``&password=``,
# ``AWS_SECRET_ACCESS_KEY=``, ``aws_secret_access_key = ``, ``"password": "..."``,
# ``X-Amz-Signature=``, ``db_pass=``; the name percent-encoded too; ``=``, ``:`` or `` = ``),
# quoted (a quote inside it too: ``password='a'b'``) or not ...
_SECRET_WORD = (
    r"token|passw(?:or)?d|passphrase|secret|api[_-]?key|apikey|credentials?|signature|"
    r"private[_-]?key|access[_-]?key(?:[_-]?id)?|account[_-]?key|auth|cookie|session[_-]?id|"
    r"(?:^|(?<=[_.\s'\"?&;,({-]))(?:pass|pwd|pw|sig|secret[_-]?key)"
)
_QUOTED = r"'(?:[^'\n]|'(?=[^\s,;)}\]&]))*'|\"(?:[^\"\\\n]|\\.)*\""
_PARAM_SECRET = re.compile(
    rf"(?i)((?:^|(?<=[?&;,\s'\"({{#]))(?:[a-z0-9.-]|_|%5f)*(?:{_SECRET_WORD})['\"]?"
    r"(?:\s*(?:=|%3d|:)\s*|%3d))"
    rf"(?:{_QUOTED}|[^&#\s'\"<>,;]+)"
)
# ... a bearer-like value (``Bearer xyz``, ``Authorization: Basic dXNlcjpwdw==``, ``Token``) ...
_BEARER = re.compile(
    r"(?i)\b(bearer(?:\s+|%20|\+)|basic(?:\s+|%20|\+)(?=[a-z0-9+/]*[0-9+/=])|"
    r"(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:bearer\s+|basic\s+|token\s+)?)"
    r"[a-z0-9._~+/=:-]+"
)
# ... a key block, and the tokens whose own shape says what they are (cloud and service keys).
_KEY_BLOCK = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY)-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    re.DOTALL,
)
_SHAPED_TOKEN = re.compile(
    r"\b(?:(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}"  # AWS key IDs
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|xox[abposr]-[A-Za-z0-9-]{8,}"  # Slack
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|sk_(?:live|test)_[A-Za-z0-9]{16,}"  # API keys
    r"|AIza[0-9A-Za-z_-]{35}"  # Google
    r"|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{30,}"  # registries, hubs
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"  # a JWT
)
_SLACK_HOOK = re.compile(r"(?i)(hooks\.slack\.com/services/)[A-Za-z0-9/]+")
# Terminal escapes: CSI (colours, cursor moves), OSC (titles, links), and the two-byte ones.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]")


def redact_secrets(text: str) -> str:
    """``text`` with every credential in it replaced by ``***``: the user part of a URL
    (``user:password@``, ``TOKEN@``) and a scheme-less ``user:password@host``'s password,
    values named as secrets (``access_token=``, ``AWS_SECRET_ACCESS_KEY=``, ``pass=``, JSON's
    ``"password": "..."``; quoted or not, a quote inside it too), bearer-like values
    (``Bearer xyz``, ``Authorization: ...``), private key blocks and tokens of a known shape
    (``AKIA...``, ``ghp_...``, ``xoxb-...``), in any case and percent-encoded. The one
    redaction of the project: whatever may reach a terminal, a log, a file or a Prefect record
    goes through it."""
    text = _KEY_BLOCK.sub(r"-----BEGIN \1-----***-----END \1-----", text)
    text = _URL_USERINFO.sub(r"\1***@", text)
    text = _BARE_USERINFO.sub(r"\1***", text)
    text = _PARAM_SECRET.sub(_keep_quotes, text)
    text = _BEARER.sub(r"\1***", text)
    text = _SLACK_HOOK.sub(r"\1***", text)
    return _SHAPED_TOKEN.sub("***", text)


def _keep_quotes(found: re.Match[str]) -> str:
    """A named secret's value as ``***``, inside its quotes when it was quoted (JSON stays
    JSON)."""
    value = found.group(0)[len(found.group(1)) :]
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{found.group(1)}{quote}***{quote}"


class SecretsFilter(logging.Filter):
    """A log record's text with its credentials redacted (``redact_secrets``), on whatever
    handler shows or keeps it: the terminal, a file, Prefect's records of a run (what reaches
    its database). The record is changed in place and always passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record``'s message and its traceback's text; True."""
        redact_record(record)
        return True


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` with its message formatted and redacted, and its traceback's text (which
    handlers print instead of formatting the exception again) redacted too."""
    if getattr(record, "_secrets_redacted", False):
        return record
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: said as its parts, not raised
        message = f"{record.msg} {record.args}"
    record.msg, record.args = redact_secrets(message), None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    if record.exc_text:
        said = redact_secrets(record.exc_text)
        if said != record.exc_text:  # the exception itself holds a credential: only its
            record.exc_info = None  # redacted text goes on (a JSON or rich handler reads it raw)
        record.exc_text = said
    if record.stack_info:
        record.stack_info = redact_secrets(record.stack_info)
    record._secrets_redacted = True
    return record


_FACTORY: list[Callable[..., logging.LogRecord]] = []  # the factory before ours, once set


def redact_logging() -> None:
    """Redact credentials in every log record of this process, from now on: each record is
    redacted as it is made (so handlers added later, Prefect's among them, get it redacted),
    and every handler present gets a ``SecretsFilter`` too. Idempotent."""
    if not _FACTORY:
        previous = logging.getLogRecordFactory()
        _FACTORY.append(previous)

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            return redact_record(previous(*args, **kwargs))

        logging.setLogRecordFactory(factory)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if not any(isinstance(f, SecretsFilter) for f in handler.filters):
                handler.addFilter(SecretsFilter())


def strip_ansi(text: str) -> str:
    """``text`` without terminal escapes (colours, cursor moves, titles)."""
    return _ANSI.sub("", text)


def strip_controls(text: str) -> str:
    """A document's text without terminal escapes and control characters (new lines and
    tabs kept), and without the password of any URL in it."""
    text = strip_ansi(text)
    text = "".join(c for c in text if c in "\n\t" or unicodedata.category(c) != "Cc")
    return redact_secrets(text)


def printable(text: str) -> str:
    """Third-party text made safe for a report: terminal escapes removed, every other control
    character (tabs and new lines included) turned into a space, secrets in URLs redacted."""
    text = strip_ansi(text)
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    return redact_secrets(text)


def say_step(seconds: float) -> str:
    """A training step's time as the re-forecasts and the report say it: milliseconds, two
    decimals (``0.51 ms``), whatever the step's size, so a pilot's and a call's compare."""
    return f"{seconds * 1000:.2f} ms"


def say_exact(x: float) -> str:
    """A number as the spec wrote it: the shortest text that reads back as the same float
    (``0.95``, ``0.0002``, ``3.5``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def say_number(
    x: float, *, against: float | None = None, digits: int = 4, signed: bool = False
) -> str:
    """``x`` to ``digits`` significant digits, more when fewer would hide how it compares
    with ``against`` (a threshold, a minimum gain): the printed numbers compare as the true
    ones do, so ``0.000241`` is never shown as ``0.0002`` beside a threshold of ``0.0002``.
    """
    sign = "+" if signed else ""
    for d in range(digits, 18):
        text = f"{x:{sign}.{d}g}"
        if against is None or _cmp(float(text), against) == _cmp(x, against):
            return text
    return f"{x:{sign}.17g}"


def _cmp(a: float, b: float) -> int:
    return (a > b) - (a < b)
