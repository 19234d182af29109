"""What every check of ``verify`` reads: the folder, its files, the parsed manifest, the texts
and JSON documents of its files (each read once), and the problem a check names.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucampaign.close.manifest import list_files
from gpucampaign.core.files import sha256_file
from gpucampaign.folder.layout import MANIFEST

_TEXT_SUFFIXES = {
    ".json",
    ".jsonl",
    ".csv",
    ".md",
    ".txt",
    ".yaml",
    ".yml",
    ".html",
    ".sha256",
    ".toml",
    ".log",
}
_DATA_URI = re.compile(r"data:[^\"')\s]+")


@dataclass
class Problem:
    """One named defect of an output folder."""

    code: str
    path: str
    detail: str


# --- paths ----------------------------------------------------------------------------------
def _temp_roots() -> list[str]:
    roots = {"/tmp", "/var/tmp", "/dev/shm", "/var/folders", "/private/tmp", "/private/var/folders"}
    for r in (tempfile.gettempdir(), os.environ.get("TMPDIR")):
        if r:
            roots.add(str(Path(r)).rstrip("/") or "/")
    return sorted((r for r in roots if r != "/"), key=len, reverse=True)


def _temp_pattern() -> re.Pattern[str]:
    alts = "|".join(re.escape(r) for r in _temp_roots())
    # Not preceded by a path character, so "runs/x/tmp/y" (a folder named tmp inside OUT) is fine.
    return re.compile(
        rf"(?<![\w.~/-])(?:{alts})(?=[/\\\"'\s,;:)\]}}>]|$)|AppData[\\/]+Local[\\/]+Temp", re.I
    )


def _linked_dirs(root: Path) -> list[str]:
    """Relative posix paths of the links to folders under ``root`` (never followed)."""
    out = []
    for dirpath, dirnames, _ in os.walk(root, followlinks=False):
        out += [
            (Path(dirpath) / d).relative_to(root).as_posix()
            for d in dirnames
            if (Path(dirpath) / d).is_symlink()
        ]
    return sorted(out)


def run_id_is_a_name(rid: str) -> bool:
    """A run ID that names one folder inside ``runs/`` (no separator, never ``.`` or ``..``)."""
    return "/" not in rid and "\\" not in rid and rid not in ("", ".", "..")


# --- what the checks share ------------------------------------------------------------------
@dataclass
class VerifyContext:
    """What every check reads: the folder, its files, the parsed manifest and the options.

    ``reloaded`` is filled by ``check_models_reload`` with the runs whose model reproduced
    their predictions, ``not_reloaded`` with why a run's model was not reloaded (its recipe's
    only code is the folder's untrusted copy). ``expect``: the manifest's sha256 as kept
    outside the folder; ``trust_folder_code``: the user vouches for the folder's code;
    ``recipe_dirs``: folders of trusted recipe files (a spec's folder).
    """

    base: Path
    present: list[str]
    manifest: dict[str, Any] | None
    manifest_error: str | None = None
    reload: bool = True
    timeout_s: float = 600
    reloaded: list[str] = field(default_factory=list)
    not_reloaded: list[str] = field(default_factory=list)
    expect: str | None = None
    trust_folder_code: bool = False
    recipe_dirs: tuple[str, ...] = ()
    temp_re: re.Pattern[str] = field(default_factory=_temp_pattern)
    _anchored: bool | None = field(default=None, repr=False)
    _manifest_sha: tuple[str | None] | None = field(default=None, repr=False)
    _texts: dict[str, str | None] = field(default_factory=dict, repr=False)
    _docs: dict[str, tuple[list[Any], str | None]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(
        cls, root: str | Path, *, reload: bool = True, timeout_s: float = 600, **options: Any
    ) -> VerifyContext:
        """Read the manifest (when it parses) and list the files of an output folder;
        ``options``: ``expect``, ``trust_folder_code``, ``recipe_dirs``."""
        base = Path(root)
        manifest, error = None, None
        mpath = base / MANIFEST
        if mpath.is_file():
            try:
                manifest = json.loads(mpath.read_text(encoding="utf-8"))
                if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
                    raise ValueError("no 'files' list")
            except (ValueError, UnicodeDecodeError) as exc:
                manifest, error = None, str(exc)
        return cls(
            base=base,
            present=list_files(base),
            manifest=manifest,
            manifest_error=error,
            reload=reload,
            timeout_s=timeout_s,
            **options,
        )

    @property
    def runs(self) -> dict[str, Mapping[str, Any]]:
        """The manifest's well-formed runs (empty without a manifest); the others are named
        by ``check_manifest_runs`` and never read."""
        runs = (self.manifest or {}).get("runs") or {}
        if not isinstance(runs, Mapping):
            return {}
        return {
            rid: info
            for rid, info in runs.items()
            if isinstance(info, Mapping) and run_id_is_a_name(rid)
        }

    def manifest_sha256(self) -> str | None:
        """sha256 of ``manifest.json``'s bytes (None without one): what ``--expect`` checks,
        read once (the report names the manifest checked, not one swapped in later)."""
        if self._manifest_sha is None:
            mpath = self.base / MANIFEST
            self._manifest_sha = (sha256_file(mpath) if mpath.is_file() else None,)
        return self._manifest_sha[0]

    @property
    def anchored(self) -> bool:
        """The manifest has the sha256 the user kept outside the folder (``--expect``): checked
        once, the answer kept (a manifest swapped later does not change what was checked; the
        trusting checks read a private copy, ``verify.private``)."""
        if self._anchored is None:
            self._anchored = self.expect is not None and self.manifest_sha256() == self.expect
        return self._anchored

    def scanned(self) -> list[str]:
        """Every file whose content is checked: the files present, the links to folders (the
        walk does not follow them, so they are only named) and the manifest itself."""
        manifest = [MANIFEST] if (self.base / MANIFEST).is_file() else []
        return [*self.present, *_linked_dirs(self.base), *manifest]

    def regular(self, rel: str) -> bool:
        """A non-empty file that is not a link (links and empty files are named elsewhere)."""
        p = self.base / rel
        return not p.is_symlink() and p.stat().st_size > 0

    def text(self, rel: str) -> str | None:
        """The UTF-8 text of a regular text file; None for other files or undecodable text."""
        if rel not in self._texts:
            p = self.base / rel
            text = None
            if p.suffix.lower() in _TEXT_SUFFIXES and self.regular(rel):
                try:
                    text = p.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    text = None
            self._texts[rel] = text
        return self._texts[rel]

    def scan_text(self, rel: str) -> str | None:
        """The text searched for paths: inline data URIs of markdown and HTML cut short."""
        text = self.text(rel)
        if text is not None and Path(rel).suffix.lower() in (".html", ".md"):
            return _DATA_URI.sub("data:", text)
        return text

    def json_docs(self, rel: str) -> tuple[list[Any], str | None]:
        """The documents of a ``.json`` or ``.jsonl`` file (up to a bad line) and the error."""
        if rel not in self._docs:
            text, suffix = self.text(rel), Path(rel).suffix
            docs: list[Any] = []
            error = None
            if text is not None and suffix == ".json":
                try:
                    docs = [json.loads(text)]
                except (json.JSONDecodeError, RecursionError) as exc:
                    error = f"not valid JSON: {exc}"
            elif text is not None and suffix == ".jsonl":
                for n, line in enumerate(text.splitlines(), start=1):
                    if not line.strip():
                        continue
                    try:
                        docs.append(json.loads(line))
                    except (json.JSONDecodeError, RecursionError) as exc:  # nested too deep
                        error = f"line {n} is not valid JSON: {exc}"
                        break
            self._docs[rel] = (docs, error)
        return self._docs[rel]

    def undecodable(self, rel: str) -> bool:
        """A regular text file that is not UTF-8."""
        p = self.base / rel
        return p.suffix.lower() in _TEXT_SUFFIXES and self.regular(rel) and self.text(rel) is None
