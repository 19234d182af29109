"""``campaign init``: a ready digits campaign (corpus + spec) in a new folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpucampaign.config import load_spec
from gpucampaign.core.errors import ArgumentError
from gpucampaign.data.tables import write_digits_corpus

CORPUS_REL = "data/digits.csv"
SPEC_NAME = "campaign.yaml"

SPEC_TEMPLATE = """\
# A training campaign that must end in a decision.
# Written by `campaign init`; plan it with `campaign plan {spec_name}`.
name: digits
question: >-
  Does a small MLP reach 90% test accuracy on the fixed digits corpus, and does a higher
  learning rate, bf16 autocast or a shorter schedule change that conclusion?

packages:
  - gpu: rtx4090
    days: 3

people: 1

# The fixed corpus, pinned by its sha256. Written from scikit-learn's bundled digits.
corpus:
  path: {corpus_rel}
  sha256: {sha256}
  id_column: id
  label_column: label
  split_column: split

# The control: essential by definition. Each variant changes ONE factor.
control:
  recipe: mlp
  hidden: [128]
  optimizer: adam
  lr: 0.001
  batch_size: 64
  epochs: 20
  precision: fp32
  scheduler: cosine
  seed: 0
  eval_every: 0
  threads: 1

variants:
  - name: lr-high
    tier: useful
    changes: {{lr: 0.003}}
    hypothesis: If 3x the learning rate matches the control in fewer effective steps, later
      campaigns can train shorter.
  - name: bf16
    tier: useful
    changes: {{precision: bf16}}
    hypothesis: If bf16 autocast keeps accuracy within 0.5 points, the larger campaigns can use it.
  - name: short
    tier: exploratory
    changes: {{epochs: 8}}
    hypothesis: If 8 of the 20 epochs already clear the threshold, later campaigns can budget
      less time per run.

decision_rule:
  metric: accuracy
  direction: maximize
  threshold: 0.9
  # Two points of accuracy: what 359 test examples can resolve (a smaller gain is lost in
  # their sampling error however many seeds are bought).
  min_gain: 0.02
  select_split: val
  report_split: test

stop_rules:
  non_finite_loss: true
  below_threshold: true
  require_restart: true
  futility: true  # stop a variant that cannot win at an evaluation (README)
  not_learning: true  # stop a variant whose training loss does not fall (README)
  grace: 0.25  # neither stops a run in its first quarter of steps

pilot:
  steps: 20

checkpoint:
  keep: 3
  interruption_hours: 24
  tolerable_loss_minutes: 30

storage:
  url: local

decision_point:
  mode: auto

# The whole calendar, human and machine time. Hours are forecasts; steps with
# `run:` are re-forecast from the pilot's measurements.
calendar:
  - name: prepare
    kind: human
    hours: 1
    description: Read the question, check the spec and the corpus.
  - name: audit
    kind: machine
    resource: cpu
    hours: 0.05
    after: [prepare]
    phase: audit
    description: Corpus audit (hash, splits, leakage).
  - name: pilot
    kind: machine
    resource: gpu
    hours: 0.1
    after: [audit]
    phase: pilot
    description: First steps of every essential run; measures load, step, eval and save times.
  - name: decide
    kind: human
    hours: 0.25
    after: [pilot]
    phase: decide
    description: Decision point - continue, drop an optional variant or re-pose the question.
  - name: train-control
    kind: machine
    resource: gpu
    hours: 0.25
    after: [decide]
    run: control
  - name: train-lr-high
    kind: machine
    resource: gpu
    hours: 0.25
    after: [train-control]
    tier: useful
    run: lr-high
  - name: train-bf16
    kind: machine
    resource: gpu
    hours: 0.25
    after: [train-control]
    tier: useful
    run: bf16
  - name: train-short
    kind: machine
    resource: gpu
    hours: 0.1
    after: [train-control]
    tier: exploratory
    run: short
  - name: restart-check
    kind: machine
    resource: gpu
    hours: 0.1
    after: [train-control]
    phase: restart
    description: Save, reload in a new process, compare exactly.
  - name: predictions
    kind: machine
    resource: cpu
    hours: 0.1
    after: [train-control]
    phase: predict
    description: Predictions and error analysis of the runs.
  - name: close
    kind: machine
    resource: cpu
    hours: 0.05
    after: [predictions, restart-check]
    phase: close
    description: Manifest, verification (fresh-process reload) and the closing report.
  - name: analysis
    kind: human
    hours: 1
    after: [close]
    description: Read the results against the decision rule.
  - name: retrieve
    kind: human
    hours: 0.5
    after: [analysis]
    description: Verify the output folder and copy it off the rented machine.
"""


def init_campaign(directory: str | Path, *, seed: int = 0) -> Path:
    """Write ``directory/data/digits.csv`` and ``directory/campaign.yaml`` pinning its hash.

    Args:
        directory: New or empty-enough folder; an existing campaign there is never overwritten.
        seed: Seed of the corpus split.

    Returns:
        The path of the written spec.

    Raises:
        SpecError: ``campaign.yaml`` or the corpus file already exists there.
    """
    root = Path(directory)
    spec_path, corpus_file = root / SPEC_NAME, root / CORPUS_REL
    existing = [str(p) for p in (spec_path, corpus_file) if p.exists()]
    if existing:
        raise ArgumentError(
            f"'{root}' already holds a campaign ({', '.join(existing)}): refusing to overwrite it; "
            "choose a new folder or remove those files.",
            field="DIR",
        )
    sha = write_digits_corpus(corpus_file, seed=seed)
    spec_path.write_text(
        SPEC_TEMPLATE.format(spec_name=SPEC_NAME, corpus_rel=CORPUS_REL, sha256=sha),
        encoding="utf-8",
    )
    load_spec(spec_path)  # the template must always validate
    return spec_path


def write_spec_copy(data: dict[str, Any], *, source_dir: str | Path, dest: str | Path) -> Path:
    """Write an edited spec to ``dest/campaign.yaml`` with copies of the files it names.

    The corpus and the catalog are copied from ``source_dir`` (the original spec's folder) to
    the same relative paths under ``dest``, so the copy plans and runs on its own.

    Returns:
        The path of the written spec.

    Raises:
        SpecError: a named path would leave its folder.
    """
    import shutil

    import yaml

    from gpucampaign.config import resolve_inside

    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for field, rel in (
        ("corpus.path", (data.get("corpus") or {}).get("path")),
        ("catalog", data.get("catalog")),
    ):
        if rel:
            target = resolve_inside(dest, rel, field=field)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(resolve_inside(source_dir, rel, field=field), target)
    spec = dest / SPEC_NAME
    spec.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return spec
