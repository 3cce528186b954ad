"""An S3 store that misbehaves as S3 and its gateways do gives the DLRM raw reader every row,
or an error within its ``StoreTimeouts`` naming the object and what to do; never a wait
without end, never fewer or other rows unsaid.

moto's ``ThreadedMotoServer`` behind ``tests/support/faulty_s3.py``, which answers the
requests picked with a body cut and left silent, a connection reset in a body, a
``Content-Length`` longer than the body, 503 SlowDown (with and without ``Retry-After``),
500, 403 ExpiredToken or AccessDenied; and an object written again between the listing and
its read. Found by the probe of 2026-11-29 (docs/reliability.md, "Data where it lies").
"""

from __future__ import annotations

import gzip

import pytest

from agents.dlrm import raw
from tests.support.bounded_call import bounded_call
from tests.support.faulty_s3 import FaultyS3

moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra)")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra)")

BUCKET = "faulty"
TIMEOUTS = raw.StoreTimeouts(connect_s=1, read_s=1, request_s=2, attempts=3, backoff_s=0.05)
WITHIN_S = 3 * 2 + 3 * 0.2 + 3  # three attempts of 2 s, their waits, the loop's margin
LINE = "\t".join(["1", *["5"] * 13, *["0a1b2c3d"] * 26])
TEXT = ("\n".join([LINE] * 60) + "\n").encode()
ROWS = 60 * 2


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = FaultyS3(server.get_host_and_port(), stall_s=3 * WITHIN_S)
    options = {
        "endpoint_url": proxy.url,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    fs = raw.filesystem("s3://", options, TIMEOUTS)
    fs.mkdir(BUCKET)
    fs.pipe_file(f"{BUCKET}/days/day_0.tsv", TEXT)
    fs.pipe_file(f"{BUCKET}/days/day_1.gz", gzip.compress(TEXT[:3000]) + gzip.compress(TEXT[3000:]))
    yield fs, proxy, options
    proxy.close()
    server.stop()


@pytest.fixture(autouse=True)
def _fresh(store, tmp_path, monkeypatch):
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    store[1].faults.clear()
    store[1].seen.clear()


def _rows(url: str, options: dict) -> int:
    index = raw.load_or_build_index(url, 16, options, TIMEOUTS)
    read = raw.RawReader(storage_options=options, store_timeouts=TIMEOUTS)
    parse = raw.RawParse(raw.BadLines("skip"))  # what would hide rows read out of place
    return sum(parse(read(chunk))["labels"].size for chunk in index.chunks)


def _bounded(fn) -> dict:
    return bounded_call(fn, 2 * WITHIN_S, "the reader still waits")


@pytest.mark.parametrize(
    "fault", ["stall_mid", "reset_mid", "short", "slowdown", "slowdown_after", "internal"]
)
def test_a_fault_once_on_each_object_still_gives_every_row(store, fault):
    _, proxy, options = store
    retry_after = "3600" if fault == "slowdown_after" else None  # not waited on: bounded
    for key in ("day_0", "day_1"):
        proxy.add("GET", key, fault.removesuffix("_after"), retry_after=retry_after)
    outcome = _bounded(lambda: _rows(f"s3://{BUCKET}/days", options))
    assert outcome.get("value") == ROWS, outcome
    assert outcome["seconds"] < WITHIN_S
    assert sum(1 for _, _, done in proxy.seen if done) == 2  # both faults were met


def test_a_store_that_keeps_saying_slow_down_is_given_up_on_saying_so(store):
    _, proxy, options = store
    index = raw.load_or_build_index(f"s3://{BUCKET}/days", 16, options, TIMEOUTS)
    proxy.add("GET", "day_0", "slowdown", times=99, retry_after="1")
    read = raw.RawReader(storage_options=options, store_timeouts=TIMEOUTS)
    outcome = _bounded(lambda: read(index.chunks[0]))
    assert isinstance(outcome.get("error"), raw.StoreError), outcome
    assert outcome["seconds"] < WITHIN_S
    said = str(outcome["error"])
    assert f"s3://{BUCKET}/days/day_0.tsv" in said and "3 attempt(s)" in said
    assert "asks for fewer requests (SlowDown" in said  # not "the store is not answering"


@pytest.mark.parametrize("refusal", ["expired", "denied"])
def test_credentials_refused_in_the_middle_of_a_run_name_the_object_and_what_to_do(store, refusal):
    # Before: PermissionError("The provided token has expired."), naming no object.
    _, proxy, options = store
    index = raw.load_or_build_index(f"s3://{BUCKET}/days", 16, options, TIMEOUTS)
    proxy.add("GET", "day_1", refusal, times=99)
    read = raw.RawReader(storage_options=options, store_timeouts=TIMEOUTS)
    chunk = next(c for c in index.chunks if c.compressed)
    outcome = _bounded(lambda: read(chunk))
    assert isinstance(outcome.get("error"), raw.StoreError), outcome
    said = str(outcome["error"])
    assert f"could not read bytes {chunk.member_offset}-" in said and chunk.path in said
    assert "check the store's credentials" in said
    assert sum(1 for _, path, done in proxy.seen if done) == 1  # not tried again


@pytest.mark.parametrize("name", ["day_7.tsv", "day_8.gz"])
def test_an_object_written_again_after_the_listing_is_refused_not_read_out_of_place(store, name):
    # Before: ranged reads of the new object at the old offsets: lines cut in two, skipped
    # as malformed (or read as other values) with no word of the change.
    fs, _, options = store
    body = TEXT if name.endswith(".tsv") else gzip.compress(TEXT[:3000]) + gzip.compress(TEXT)
    fs.pipe_file(f"{BUCKET}/again/{name}", body)
    index = raw.load_or_build_index(f"s3://{BUCKET}/again", 16, options, TIMEOUTS)
    fs.pipe_file(f"{BUCKET}/again/{name}", body[:100] + b"1\t2\t3\n" + body[100:])
    read = raw.RawReader(storage_options=options, store_timeouts=TIMEOUTS)
    parse = raw.RawParse(raw.BadLines("skip"))
    with pytest.raises(ValueError, match=rf"{name} changed after it was listed .*start the"):
        for chunk in index.chunks:
            parse(read(chunk))
    fs.rm(f"{BUCKET}/again/{name}")


def test_odd_keys_and_empty_objects_give_every_row(store):
    fs, _, options = store
    for key in ("odd/day 0 +x.tsv", "odd/dé_ü.tsv", "odd/empty.tsv", "odd/part-00000"):
        fs.pipe_file(f"{BUCKET}/{key}", b"" if "empty" in key or "part" in key else TEXT)
    assert _rows(f"s3://{BUCKET}/odd", options) == 120
