"""``RELOAD.md``: the commands that check the folder, reload a run's model and predict with it,
written for this folder's real runs, corpus and versions, and runnable as written once ``OUT``
is set (``tests/close/test_reload_md.py`` runs them for a table, a folder and a ``.npy`` corpus).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpucampaign.config import BUILTIN_RECIPES
from gpucampaign.folder.layout import MODEL_DIR, RELOAD, OutputFolder, model_config, run_relpath

_HEAD = """# Reloading this campaign's models

The commands below run from any folder, on CPU, with the `gpucampaign` package installed:
{installed}. They read this folder and write nothing into it (its files are sealed in
`manifest.json`). First set `OUT` to this folder, e.g. `export OUT="$PWD"` from inside it, and,
if you like, `PRED_DIR` to the folder new predictions go to (outside `OUT`; `/tmp` when unset).

Recorded versions: {versions}.

{corpus_line}

Models (safetensors weights, `config.json` with the recipe and versions):

{run_lines}
{trust}
## 1. Check the whole folder

```bash
campaign verify "$OUT" --json
```

Exit 0 means every file matches `manifest.json` (size and sha256), no path points into a
temporary folder or out of this folder, `plan.json` is the plan written at the start, and every
model it could reload in a fresh process reproduced its `predictions.csv` exactly. Add
`--expect SHA256`, the manifest's sha256 the close printed and kept outside this folder: exit 4
when `manifest.json` is not that one, and when it is, the recipe copies kept here may run to
reload their models (no code of this folder runs otherwise).

## 2. Reload run `{name}` and compare with its predictions

```bash
python -m gpucampaign.predictions reload-check "$OUT" {run_id} --json{flag}
```

## 3. Predict with run `{name}`

{predict_words}

```bash
campaign predict "$OUT" {name}{input_arg} --to "${PRED_DIR:-/tmp}/{name}.csv"{flag}
```

or in Python (like `load_from_checkpoint` or `mlflow.pyfunc.load_model`):

```python
import os

import gpucampaign

out = os.environ["OUT"]
# runs/{run_id}/model/, on CPU, with its recipe
loaded = gpucampaign.load_model(out, "{name}"{kwarg})
print(type(loaded.model).__name__, loaded.config.recipe)
{predict_py}```
"""

_TRUST = """
Run{s} {names} trained with your own recipe: the model is rebuilt through that recipe
(`recipe: module:Class` in its `config.json`, with the recorded `args`), whose file must have
the recorded `recipe_sha256`. A copy of it is kept in each model folder (`{kept}`), and the
commands below run that copy (`--trust-folder-code`, `trust_folder_code=True`): this is the
folder your campaign wrote. For a folder that came from elsewhere, first check that it is the
one sealed (`campaign verify "$OUT" --expect SHA256`, the sha256 printed at the close), or drop
the flag and give your own recipe's folder with `--recipes DIR` (`recipes=[DIR]`).
"""


def _corpus_line(corpus_ref: Mapping[str, Any] | None) -> str:
    if corpus_ref is None:
        return "The spec names no corpus."
    if corpus_ref.get("kind") == "copied":
        return (
            f"The corpus is copied in this folder: `{corpus_ref['path']}` "
            f"(sha256 `{corpus_ref['sha256']}`)."
        )
    return (
        f"The corpus was too large to copy ({corpus_ref['size']} bytes): it stays at "
        f"`{corpus_ref['location']}` (sha256 `{corpus_ref['sha256']}`). Put a copy with that "
        "hash there (or edit nothing else) before reloading; `campaign verify` checks the hash."
    )


def _installed(environment: Mapping[str, Any], *, library_commit: str | None) -> str:
    """Which gpucampaign to install: its version, and the commits recorded at the close."""
    version = environment.get("gpucampaign")
    said = [f"`pip install gpucampaign=={version}`" if version else "`pip install gpucampaign`"]
    if library_commit:
        said.append(f"or a checkout of its commit `{library_commit}`")
    if environment.get("git_commit"):
        said.append(f"the campaign's project was at commit `{environment['git_commit']}`")
    return ", ".join(said)


def _model_info(root: Path, run_id: str) -> dict[str, Any]:
    try:
        info = json.loads((root / model_config(run_id)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def write_reload_md(
    root: str | Path,
    *,
    runs: Mapping[str, str],
    corpus_ref: Mapping[str, Any] | None,
    environment: Mapping[str, Any] | None = None,
    shown: str | None = None,
) -> Path:
    """Write ``RELOAD.md``: the exact commands to check, reload a model and predict.

    Args:
        root: the output folder.
        runs: ``{run_id: run name}`` of the runs with a saved model.
        corpus_ref: ``reference_corpus()`` (copied under data/, or external with its sha256).
        environment: ``collect_environment()``, for the versions to install.
        shown: the run the commands use (the verdict's run); the first of ``runs`` otherwise.
    """
    base = Path(root)
    env = environment or {}
    infos = {rid: _model_info(base, rid) for rid in runs}
    keys = ("python", "torch", "safetensors", "gpucampaign")
    versions = ", ".join(f"{k} {env[k]}" for k in keys if env.get(k))
    run_lines = "\n".join(
        f"- `{run_relpath(rid, MODEL_DIR)}/` ({name})" for rid, name in runs.items()
    )
    commits = [(i.get("git") or {}).get("commit") for i in infos.values()]
    by_recipe = [rid for rid, i in infos.items() if i.get("recipe", "mlp") not in BUILTIN_RECIPES]
    text = _reload_text(
        runs,
        shown=next((rid for rid, n in runs.items() if n == shown), next(iter(runs), None)),
        corpus_ref=corpus_ref,
        by_recipe=by_recipe,
    )
    text = _fill(
        text,
        installed=_installed(env, library_commit=next((c for c in commits if c), None)),
        versions=versions or "see manifest.json",
        corpus_line=_corpus_line(corpus_ref),
        run_lines=run_lines or "- (no completed run)",
    )
    return OutputFolder(root).write_text(RELOAD, text)


def _fill(template: str, **values: str) -> str:
    """``template`` with each ``{key}`` replaced (no other brace is touched: shell and Python
    code keep theirs)."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def _reload_text(
    runs: Mapping[str, str],
    *,
    shown: str | None,
    corpus_ref: Mapping[str, Any] | None,
    by_recipe: list[str],
) -> str:
    """The template with the run, the input and the trust filled in (versions left to fill)."""
    if shown is None:
        head = _HEAD.split("## 1.")[0].replace("{trust}", "")
        return head + "No run completed: there is no model to reload.\n"
    name = runs[shown]
    trusted = shown in by_recipe
    input_arg, predict_py = "", ""
    words = "Without `--input`, the campaign's own decision split is predicted."
    if corpus_ref is not None:
        copied = corpus_ref.get("kind") == "copied"
        where = f"$OUT/{corpus_ref['path']}" if copied else str(corpus_ref["location"])
        input_arg = f' --input "{where}"'
        source = f'os.path.join(out, "{corpus_ref["path"]}")' if copied else repr(where)
        predict_py = (
            f"rows = loaded.predict({source})  # one row per example, keyed by its ID\n"
            'print(len(rows), "rows; first:", rows[0])\n'
        )
        words = (
            "`--input` takes new input of the corpus's kind (here the campaign's own corpus):\n"
            "each row is keyed by its example's ID and split. " + words
        )
    trust = ""
    if by_recipe:
        names = ", ".join(f"`{runs[r]}`" for r in by_recipe)
        kept = f"{run_relpath(by_recipe[0], MODEL_DIR)}/recipe/"
        trust = _fill(_TRUST, s="s" if len(by_recipe) > 1 else "", names=names, kept=kept)
    return _fill(
        _HEAD,
        name=name,
        run_id=shown,
        flag=" --trust-folder-code" if trusted else "",
        kwarg=", trust_folder_code=True" if trusted else "",
        input_arg=input_arg,
        predict_py=predict_py,
        predict_words=words,
        trust=trust,
    )
