"""The hashes an S3 upload and download are checked with, without a server."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Callable

from awscrt.checksums import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucampaign.storage.s3client import HashingSink, file_digests, file_etag

MIB = 1024 * 1024


def _write_ranges(sink: HashingSink, data: bytes, *, chunk: int, order: list[int]) -> None:
    """Write ``data`` in ``chunk``-sized ranges in ``order``, as parallel ranged GETs do."""
    starts = list(range(0, len(data), chunk))
    for i in order:
        sink.seek(starts[i])
        sink.write(data[starts[i] : starts[i] + chunk])


def _assert_sink_holds(data: bytes, *, to_file: bool, write: Callable[[HashingSink], None]):
    """A sink (over a file, or into memory) given ``write`` holds exactly ``data``: its bytes,
    size and sha256. Small hash batches, so that several are queued even for small inputs."""
    target = io.BytesIO() if to_file else None
    with HashingSink(target, size=len(data)) as sink:
        sink._BATCH = 256
        write(sink)
        assert sink.hexdigest() == hashlib.sha256(data).hexdigest()
        assert sink.size == len(data)
        kept = target.getvalue() if target is not None else bytes(sink.data())
    assert kept == data


@settings(max_examples=40, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=5000),
    chunk=st.integers(min_value=1, max_value=700),
    seed=st.randoms(use_true_random=False),
    to_file=st.booleans(),
)
def test_a_sink_hashes_ranges_written_in_any_order(data, chunk, seed, to_file):
    order = list(range(len(range(0, len(data), chunk))))
    seed.shuffle(order)
    _assert_sink_holds(
        data, to_file=to_file, write=lambda s: _write_ranges(s, data, chunk=chunk, order=order)
    )


def test_a_retried_range_written_again_changes_nothing():
    data = bytes(range(256)) * 40

    def write(sink: HashingSink) -> None:
        _write_ranges(sink, data, chunk=1000, order=[0, 1, 2])
        _write_ranges(sink, data, chunk=1000, order=[1, 2])  # range 1 retried from its start
        sink.seek(2500)  # a retry whose chunks start inside what is hashed
        sink.write(data[2500:3600])
        sink.seek(5000)  # a short piece ahead of the hash, then the whole range
        sink.write(data[5000:5100])
        _write_ranges(sink, data, chunk=1000, order=[5, 3, 4, 6, 7, 8, 9, 10])

    for to_file in (False, True):
        _assert_sink_holds(data, to_file=to_file, write=write)


def test_a_gap_or_extra_bytes_do_not_pass_for_the_object():
    data = bytes(range(256)) * 40
    with HashingSink(None, size=len(data)) as sink:
        _write_ranges(sink, data, chunk=1000, order=[0, 2, 3])  # range 1 never arrived
        assert sink.hexdigest() != hashlib.sha256(data).hexdigest()
    with HashingSink(None, size=10) as sink:
        try:
            sink.write(b"x" * 11)
        except OSError as exc:
            assert "more bytes" in str(exc)
        else:
            raise AssertionError("a sink took more bytes than the object lists")


def test_file_digests_are_what_s3_reports(tmp_path):
    data = bytes(range(256)) * (12 * MIB // 256) + b"tail"
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    part = 5 * MIB
    parts = [data[i : i + part] for i in range(0, len(data), part)]
    whole = file_digests(path, part_size=None)
    assert whole.sha256 == hashlib.sha256(data).hexdigest() and whole.size == len(data)
    assert whole.crc32c == base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()
    # In parts: the CRC32C of the parts' CRC32Cs and their count, as S3 reports a composite.
    crcs = b"".join(crc32c(p).to_bytes(4, "big") for p in parts)
    composite = base64.b64encode(crc32c(crcs).to_bytes(4, "big")).decode()
    in_parts = file_digests(path, part_size=part, sha256=False)
    assert in_parts.crc32c == f"{composite}-3" and in_parts.sha256 is None
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    assert file_etag(path, part_size=part) == f"{hashlib.md5(md5s).hexdigest()}-3"
    assert file_etag(path, part_size=None) == hashlib.md5(data).hexdigest()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert file_digests(empty, part_size=None).sha256 == hashlib.sha256(b"").hexdigest()


def test_the_digest_is_there_after_the_block():
    """The download's hash is asked for after the sink's block (``read_hashed`` does): it must
    not ask a hashing thread that was shut down ("cannot schedule new futures")."""
    data = bytes(range(256)) * 100
    with HashingSink(None, size=len(data)) as sink:
        sink._BATCH = 256
        _write_ranges(sink, data, chunk=700, order=list(range(len(range(0, len(data), 700)))))
    assert sink.hexdigest() == hashlib.sha256(data).hexdigest()
    try:
        with HashingSink(None, size=len(data)) as failed:
            failed._BATCH = 256
            _write_ranges(failed, data, chunk=700, order=[0, 1, 2])
            raise KeyError("the download broke")
    except KeyError:
        pass
    assert failed.hexdigest() == hashlib.sha256(data[:2100]).hexdigest()


class _FakeS3:
    """The few client calls ``S3Store`` reads through: one object, its metadata as given."""

    class meta:  # noqa: N801 - boto3's attribute name
        endpoint_url = "http://fake:1"

    def __init__(self, body: bytes, metadata: dict[str, str]) -> None:
        self.body, self.metadata = body, metadata

    def head_object(self, **_: object) -> dict[str, object]:
        return {"ContentLength": len(self.body), "Metadata": self.metadata}

    def download_fileobj(self, *, Fileobj, **_: object) -> None:  # noqa: N803
        Fileobj.seek(0)
        Fileobj.write(self.body)


def test_an_object_altered_in_the_bucket_is_read_with_its_hash_or_refused_naming_both():
    from gpucampaign.storage import ContentMismatch, S3Store

    good = b"checkpoint bytes" * 1000
    bad = bytearray(good)
    bad[100:164] = bytes(b ^ 0xFF for b in bad[100:164])
    want, got = hashlib.sha256(good).hexdigest(), hashlib.sha256(bad).hexdigest()
    # Replaced without our metadata (aws s3 cp): the bytes come back with their real hash.
    store = S3Store("s3://b/p", client=_FakeS3(bytes(bad), {}))
    data, digest = store.read_hashed("run/step-000000020/model.safetensors")
    assert bytes(data) == bytes(bad) and digest == got
    # Replaced keeping the old metadata: refused, both hashes named.
    store = S3Store("s3://b/p", client=_FakeS3(bytes(bad), {"sha256": want}))
    try:
        store.read_hashed("run/step-000000020/model.safetensors")
    except ContentMismatch as exc:
        assert (exc.expected, exc.actual) == (want, got) and want in str(exc) and got in str(exc)
    else:
        raise AssertionError("an altered object was read as good")


def test_the_client_times_out_like_a_refused_server():
    """A frozen server (it took the connection and answers nothing) fails a request within the
    read timeout, so the spool takes the checkpoint; both timeouts come from the environment."""
    import pytest

    from gpucampaign.storage.open import SPOOLED_ATTEMPTS, open_store
    from gpucampaign.storage.s3client import s3_client

    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k"}
    config = s3_client({**env, "AWS_SECRET_ACCESS_KEY": "s"}).meta.config
    assert (config.connect_timeout, config.read_timeout) == (5.0, 25.0)
    tuned = {
        **env,
        "AWS_SECRET_ACCESS_KEY": "s",
        "GPUCAMPAIGN_S3_CONNECT_TIMEOUT_S": "2",
        "GPUCAMPAIGN_S3_READ_TIMEOUT_S": "7.5",
    }
    config = s3_client(tuned).meta.config
    assert (config.connect_timeout, config.read_timeout) == (2.0, 7.5)
    for bad in ("0", "nan", "inf", "soon"):
        with pytest.raises(ValueError, match="GPUCAMPAIGN_S3_READ_TIMEOUT_S"):
            s3_client({**tuned, "GPUCAMPAIGN_S3_READ_TIMEOUT_S": bad})
    # With the spool behind it a request gives up after two attempts: at most ~1 min frozen.
    store = open_store("s3://bucket/p", out=".", env={**env, "AWS_SECRET_ACCESS_KEY": "s"})
    client = store.remote._client  # type: ignore[attr-defined]
    assert client.meta.config.retries["total_max_attempts"] == SPOOLED_ATTEMPTS == 2
    assert SPOOLED_ATTEMPTS * client.meta.config.read_timeout < 60  # spooled within a minute


def test_the_schema_and_compose_name_the_variables_the_code_reads():
    import json
    from pathlib import Path

    from gpucampaign.config import CampaignSpec
    from gpucampaign.storage.s3client import S3_VARIABLES

    schema = json.dumps(CampaignSpec.model_json_schema())
    compose = (Path(__file__).parents[2] / "infra" / "compose.yaml").read_text()
    for name in S3_VARIABLES:
        assert name in schema, name
    for name in ("AWS_ENDPOINT_URL:", "AWS_ACCESS_KEY_ID:", "GPUCAMPAIGN_S3_READ_TIMEOUT_S:"):
        assert name in compose, name
    assert "GPUCAMPAIGN_S3_ENDPOINT" not in schema + compose  # read by nothing
