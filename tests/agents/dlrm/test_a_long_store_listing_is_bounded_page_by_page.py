"""A prefix of more objects than one listing page holds is listed page by page, each page a
request of its own within ``StoreTimeouts.request_s``: a listing longer than that bound on a
working store goes on while pages come, and a page that does not come ends it within the
bound, naming the page and the URL.

Before, the whole listing (s3fs's ``find``: every page in one call) was one request under
``request_s``: 2,105 keys took 7.5 s against moto under load, and a prefix of a few hundred
thousand objects would time out on a healthy store (docs/reliability.md, Known gaps).

moto's ``ThreadedMotoServer`` (a real S3 API on this host; AWS cannot be reached from here)
behind ``tests/support/faulty_s3.py``, which holds each listing's answer back a while.
"""

from __future__ import annotations

import pytest

from agents.dlrm import raw
from tests.support.bounded_call import bounded_call
from tests.support.faulty_s3 import FaultyS3

moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra)")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra)")

BUCKET = "long-listing"
# One more object than two pages of S3's 1,000 keys hold: three pages.
OBJECTS = 2 * 1000 + 5
# Each page's answer held back DELAY_S: three pages take longer than one request's bound, one
# page (with moto's own time for 1,000 keys, under load) well within it.
DELAY_S = 1.2
TIMEOUTS = raw.StoreTimeouts(connect_s=2, read_s=3, request_s=3.0, attempts=1, backoff_s=0.05)
LINE = "\t".join(["1", *["5"] * 13, *["0a1b2c3d"] * 26]) + "\n"
LISTING = "list-type=2"  # ListObjectsV2's query


@pytest.fixture(scope="module")
def store():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = FaultyS3(server.get_host_and_port(), stall_s=60, delay_s=DELAY_S)
    options = {
        "endpoint_url": proxy.url,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    fs = raw.filesystem("s3://", options, TIMEOUTS)
    fs.mkdir(BUCKET)
    # Many files, as a Spark job writes a day, put into moto's backend in this process (the
    # server's own): the objects 2,005 PUTs would make, in 0.1 s rather than 16 s under load.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for i in range(OBJECTS):
        backend.put_object(BUCKET, f"days/part-{i:05d}.tsv", LINE.encode())
    yield proxy, options
    proxy.close()
    server.stop()


@pytest.fixture(autouse=True)
def _fresh(store):
    store[0].faults.clear()
    store[0].seen.clear()


def _listings(proxy: FaultyS3) -> int:
    return sum(1 for method, path, _ in proxy.seen if method == "GET" and LISTING in path)


def test_a_listing_longer_than_one_requests_bound_lists_every_object(store):
    proxy, options = store
    proxy.add("GET", LISTING, "delay", times=100)
    outcome = bounded_call(
        lambda: raw.store_files(f"s3://{BUCKET}/days", options, TIMEOUTS),
        60,
        "the listing still waits",
    )
    files = outcome.get("value")
    assert files is not None, outcome
    assert len(files) == OBJECTS
    assert {f["name"] for f in files} == {f"part-{i:05d}.tsv" for i in range(OBJECTS)}
    assert all(f["etag"] for f in files), "each object keeps its ETag for its reads"
    assert _listings(proxy) == 3, proxy.seen[:5]


def test_a_page_that_never_comes_ends_the_listing_within_its_bound_naming_the_page(store):
    proxy, options = store
    proxy.add("GET", LISTING, "delay", times=1)
    proxy.add("GET", LISTING, "stall_mid", times=1)  # the second page: half, then silence
    outcome = bounded_call(
        lambda: raw.store_files(f"s3://{BUCKET}/days", options, TIMEOUTS),
        # the first page (DELAY_S and moto's time), the second's bound, the loop's second
        DELAY_S + TIMEOUTS.request_s + 1 + 10,
        "the listing still waits on a page that never comes",
    )
    error = outcome.get("error")
    assert isinstance(error, raw.StoreError), outcome
    assert f"could not list page 2 of s3://{BUCKET}/days" in str(error)
    assert "no answer within 3 s" in str(error)
