"""`campaign init`'s campaign, and copies of an edited spec that plan and run on their own."""

from __future__ import annotations

import pytest
import yaml

from gpucampaign.cli.scaffold import init_campaign, write_spec_copy
from gpucampaign.config import SpecError, load_spec
from gpucampaign.recipe.audit import audit_corpus


def test_an_edited_copy_carries_its_corpus(tmp_path):
    spec = init_campaign(tmp_path / "orig")
    data = yaml.safe_load(spec.read_text())
    data["name"] = "copy"
    copy = write_spec_copy(data, source_dir=spec.parent, dest=tmp_path / "copy")
    cs = load_spec(copy)
    assert cs.name == "copy"
    assert audit_corpus(cs, base_dir=copy.parent)["ok"]  # the pinned hash holds in the copy


def test_a_copy_never_reads_or_writes_outside_its_folders(tmp_path):
    spec = init_campaign(tmp_path / "orig")
    data = yaml.safe_load(spec.read_text())
    data["corpus"]["path"] = "../../etc/passwd"
    with pytest.raises(SpecError, match="corpus.path"):
        write_spec_copy(data, source_dir=spec.parent, dest=tmp_path / "copy")
