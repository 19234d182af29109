"""A tracking server's URI as the spec, the preflight and ``campaign track`` take it."""

from __future__ import annotations

from urllib.parse import urlsplit

TRACKING_SCHEMES = ("http", "https")


def check_tracking_uri(uri: str, *, credentials: bool = False) -> str:
    """A tracking server's URI, normalized (no surrounding space): ``http(s)://host[:port]``
    with an optional path, no query, no fragment; ``credentials``: a ``user:password@`` part
    may be in it (``MLFLOW_TRACKING_URI``, the environment's), else it is refused (a spec).

    Raises:
        ValueError: A URI that is not that, in words that never repeat a credential.
    """
    value = uri.strip()
    if not value:
        raise ValueError("give a tracking URI (http://host:port), or leave 'uri' out")
    parts = urlsplit(value)
    if parts.scheme.lower() not in TRACKING_SCHEMES or not parts.hostname:
        raise ValueError(
            "the tracking URI must name an MLflow tracking server as http://host:port or "
            "https://host (a file: or database store, a relative path, ftp:// and other "
            "schemes are not supported: start `mlflow server` and give its address)"
        )
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError("the tracking URI holds a space or a control character: remove it")
    if parts.query or parts.fragment or "?" in value:
        raise ValueError(
            "the tracking URI takes no query or fragment ('?...', '#...'): a token goes in "
            "MLFLOW_TRACKING_TOKEN in the environment"
        )
    if "@" in parts.netloc and not credentials:
        raise ValueError(
            "the tracking URI holds credentials; remove the part before '@' and set "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) "
            "in the environment"
        )
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError:
        raise ValueError("the tracking URI's port is not a number from 1 to 65535") from None
    return value
