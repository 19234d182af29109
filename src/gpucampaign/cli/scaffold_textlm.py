"""``campaign init --example textlm``: a character-level language model on a fixed text.

The corpus is the documentation scikit-learn ships with its bundled datasets (the ``.rst``
files of ``sklearn/datasets/descr``), concatenated in sorted file-name order: no download, and
the same bytes for the same scikit-learn release. The recipe file (``textlm.py``) is the user's
code, copied from the project's ``examples/textlm/`` (the package carries that file as
``example_textlm.py.txt``, so an installed ``campaign`` writes it from any folder).
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from gpucampaign.config import load_spec
from gpucampaign.core.errors import ArgumentError

CORPUS_REL = "data/sklearn-docs.txt"
RECIPE_FILE = "textlm.py"
EXAMPLE_RECIPE = "example_textlm.py.txt"  # package data: a link to examples/textlm/textlm.py
SPEC_NAME = "campaign.yaml"

SPEC_TEMPLATE = """\
# A character-level transformer language model, trained by your own recipe (textlm.py).
# Written by `campaign init --example textlm`; plan it with `campaign plan {spec_name}`.
name: textlm
question: >-
  Does a 2-layer character transformer reach a validation loss under 3.5 nats per byte on
  the fixed text, and does a narrower model or a higher learning rate change that?

packages:
  - gpu: rtx4090
    days: 3

# One text file, pinned by its sha256: scikit-learn's bundled dataset descriptions.
corpus:
  path: {corpus_rel}
  sha256: {sha256}

# The recipe is the class CharLM in textlm.py next to this file; `args` are its arguments.
control:
  recipe: "textlm:CharLM"
  args: {{layers: 2, width: 128, heads: 4, context: 64}}
  optimizer: adamw
  lr: 0.001
  weight_decay: 0.01
  batch_size: 32
  epochs: 4
  scheduler: cosine
  seed: 0
  threads: 1
  device: auto

variants:
  - name: narrow
    tier: useful
    changes: {{args: {{width: 64}}}}
    hypothesis: If half the width loses less than 0.05 nats, later campaigns can train smaller.
  - name: lr-high
    tier: useful
    changes: {{lr: 0.003}}
    hypothesis: If 3x the learning rate lowers the loss, the short schedule is under-trained.

decision_rule:
  metric: loss
  direction: minimize
  threshold: 3.5
  min_gain: 0.01
  select_split: val

pilot:
  steps: 10

calendar:
  - {{name: prepare, kind: human, hours: 0.5}}
  - {{name: audit, kind: machine, resource: cpu, hours: 0.02, after: [prepare], phase: audit}}
  - {{name: pilot, kind: machine, resource: gpu, hours: 0.05, after: [audit], phase: pilot}}
  - {{name: decide, kind: human, hours: 0.1, after: [pilot], phase: decide}}
  - {{name: train-control, kind: machine, resource: gpu, hours: 0.1, after: [decide],
     run: control}}
  - {{name: train-narrow, kind: machine, resource: gpu, hours: 0.1, after: [train-control],
     tier: useful, run: narrow}}
  - {{name: train-lr-high, kind: machine, resource: gpu, hours: 0.1, after: [train-control],
     tier: useful, run: lr-high}}
  - {{name: restart-check, kind: machine, resource: gpu, hours: 0.05, after: [train-control],
     phase: restart}}
  - {{name: predictions, kind: machine, resource: cpu, hours: 0.05, after: [train-control],
     phase: predict}}
  - {{name: close, kind: machine, resource: cpu, hours: 0.05,
     after: [predictions, restart-check], phase: close}}
  - {{name: analysis, kind: human, hours: 0.5, after: [close]}}
"""


def write_textlm_corpus(path: str | Path) -> str:
    """Write scikit-learn's dataset descriptions, concatenated in a fixed order; its sha256."""
    import sklearn

    descr = Path(sklearn.__file__).resolve().parent / "datasets" / "descr"
    files = sorted(descr.glob("*.rst"), key=lambda p: p.name)
    if not files:
        raise ArgumentError(
            f"no dataset descriptions found in {descr}: is scikit-learn installed?", field="example"
        )
    raw = b"".join(f.read_bytes().rstrip(b"\n") + b"\n\n" for f in files)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()


def example_recipe() -> bytes:
    """The bytes of ``examples/textlm/textlm.py``, as the installed package carries them."""
    return (resources.files("gpucampaign.cli") / EXAMPLE_RECIPE).read_bytes()


def init_textlm(directory: str | Path) -> Path:
    """Write ``DIR/campaign.yaml``, ``DIR/textlm.py`` and ``DIR/data/sklearn-docs.txt``.

    Raises:
        SpecError: One of those files already exists there.
    """
    root = Path(directory)
    targets = (root / SPEC_NAME, root / CORPUS_REL, root / RECIPE_FILE)
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise ArgumentError(
            f"'{root}' already holds a campaign ({', '.join(existing)}): refusing "
            "to overwrite it; choose a new folder or remove those files.",
            field="DIR",
        )
    recipe = example_recipe()
    sha = write_textlm_corpus(root / CORPUS_REL)
    (root / RECIPE_FILE).write_bytes(recipe)
    spec_path = root / SPEC_NAME
    spec_path.write_text(
        SPEC_TEMPLATE.format(spec_name=SPEC_NAME, corpus_rel=CORPUS_REL, sha256=sha),
        encoding="utf-8",
    )
    load_spec(spec_path)  # the template must always validate
    return spec_path
