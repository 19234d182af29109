"""The close reads an input changed during the campaign from the copy the folder kept at its
start, and names it; without a copy it closes all the same, the runs not reload-checked."""

from __future__ import annotations

from gpucampaign.cli.scaffold import init_campaign
from gpucampaign.close.closing import delivery
from gpucampaign.close.inputs import closing_inputs
from gpucampaign.close.manifest import keep_inputs
from gpucampaign.config import load_spec
from gpucampaign.folder.records import RunState


def test_a_corpus_changed_mid_campaign_is_read_from_the_kept_copy_and_named(tmp_path):
    spec_path = init_campaign(tmp_path / "spec")
    spec, base, out = load_spec(spec_path), spec_path.parent, tmp_path / "out"
    out.mkdir()
    keep_inputs(out, spec, base_dir=base)  # the campaign's start
    assert closing_inputs(spec, root=out, base_dir=base).changed == []

    corpus = base / "data" / "digits.csv"
    corpus.write_bytes(corpus.read_bytes() + b"\n")  # changed during the campaign
    read = closing_inputs(spec, root=out, base_dir=base)
    assert read.corpus is not None and read.path == (out / "data" / "digits.csv")
    assert read.corpus.sha256 == spec.corpus.sha256
    [line] = read.changed
    assert line.startswith("the corpus 'data/digits.csv' changed during the campaign")
    assert f"not the pinned {spec.corpus.sha256}" in line
    assert line.endswith("the close read the copy kept in the output folder (data/digits.csv)")
    assert str(tmp_path) not in line  # the folder moves: no absolute path in the report

    (out / "data" / "digits.csv").unlink()  # and no copy kept
    gone = closing_inputs(spec, root=out, base_dir=base)
    assert gone.corpus is None and gone.path is None
    assert gone.changed[0].endswith("the output folder keeps no copy of it")
    state = RunState(
        run="control", run_id="control-0123456789", tier="essential", status="completed"
    )
    checked = delivery(out, state, corpus=None)
    assert not checked["accepted"] and "not reload-checked" in checked["reason"]
