"""The job a data-parallel run hands its ranks (``engine/jobfile.py``), in one process: what
the launcher writes is what a rank rebuilds (the spec with its replicate seeds, the run, the
corpus it loads itself), and anything else is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpucampaign.config import SpecError
from gpucampaign.core.files import sha256_bytes
from gpucampaign.engine.jobfile import JobRefused, build_job, job_bytes, open_job, write_private
from gpucampaign.engine.setup import RunJob
from gpucampaign.folder.layout import RunFolder
from gpucampaign.storage import LocalStore
from tests.helpers import digits_file  # noqa: F401  (fixture)
from tests.helpers.engine import corpus_of, make_spec


def _job(tmp_path: Path, digits: tuple[Path, str], **kw: object) -> RunJob:
    spec = make_spec(tmp_path, digits, control={"gpus": 2, "seeds": [3, 4]})
    return RunJob(
        spec=spec,
        run=spec.resolve_run("control.s4"),
        corpus=corpus_of(tmp_path, spec),
        store=LocalStore(tmp_path / "out" / "checkpoints"),
        run_folder=RunFolder.of(tmp_path / "out", spec.resolve_run("control.s4").run_id),
        stop_after_steps=7,
        lane=1,
        **kw,  # type: ignore[arg-type]
    )


def _written(tmp_path: Path, job: RunJob) -> tuple[Path, bytes]:
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    data = job_bytes(job, outcome_file=work / "outcome.json", stop_file=work / "stop")
    write_private(work / "job.json", data)
    return work / "job.json", data


def test_what_the_launcher_writes_is_what_a_rank_rebuilds(tmp_path: Path, digits_file) -> None:  # noqa: F811
    job = _job(tmp_path, digits_file)
    path, data = _written(tmp_path, job)
    assert path.stat().st_mode & 0o777 == 0o600
    handed = build_job(open_job(path, sha256=sha256_bytes(data)))
    got = handed.job
    assert got.spec == job.spec and got.run == job.run
    assert got.spec.run_names() == job.spec.run_names()  # the replicate seeds came along
    assert (got.run_folder, got.stop_after_steps, got.checkpoint_every, got.lane) == (
        job.run_folder,
        7,
        None,
        1,
    )
    assert isinstance(got.store, LocalStore) and got.store.root == job.store.root
    assert got.corpus.sha256 == job.corpus.sha256 and got.corpus.classes == job.corpus.classes
    for name, split in job.corpus.splits.items():
        assert np.array_equal(got.corpus.splits[name].X, split.X)
        assert np.array_equal(got.corpus.splits[name].y, split.y)
    assert handed.outcome_file == tmp_path / "work" / "outcome.json"
    assert json.loads(data)["corpus"]["path"] == str(tmp_path / "data" / "digits.csv")
    assert len(data) < (tmp_path / "data" / "digits.csv").stat().st_size / 4  # not a copy


def test_a_job_file_that_is_not_the_launchers_is_refused(tmp_path: Path, digits_file) -> None:  # noqa: F811
    path, data = _written(tmp_path, _job(tmp_path, digits_file))
    path.write_bytes(data.replace(b'"lane": 1', b'"lane": 0'))
    with pytest.raises(JobRefused, match="not the one its launcher wrote"):
        open_job(path, sha256=sha256_bytes(data))
    link = tmp_path / "work" / "link.json"
    link.symlink_to(path)
    with pytest.raises(JobRefused, match="cannot be read"):
        open_job(link, sha256=sha256_bytes(data))


def test_a_store_or_corpus_that_cannot_be_handed_over_is_refused(
    tmp_path: Path,
    digits_file,  # noqa: F811
) -> None:
    class Remote(LocalStore):
        pass

    job = _job(tmp_path, digits_file)
    for bad in (
        RunJob(**{**job.__dict__, "store": Remote(tmp_path / "s")}),
        RunJob(**{**job.__dict__, "corpus": {"rows": [1, 2]}}),
    ):
        with pytest.raises(SpecError, match="cannot be handed to the training processes") as err:
            job_bytes(bad, outcome_file=tmp_path / "o", stop_file=tmp_path / "s")
        assert err.value.field == "gpus"
