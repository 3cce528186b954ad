"""An object store that accepts connections and then never answers ends the DLRM raw
reader's wait within its ``StoreTimeouts``, with an error naming the URL and what to do.

The store is moto's ``ThreadedMotoServer`` (a real S3 API over HTTP on this host, spoken to
by s3fs/aiobotocore as they speak to AWS, which this machine cannot reach) behind
``tests/support/stalling_tcp.py``: a TCP proxy that forwards until ``stall()``, then holds
every connection, old and new, open and silent, as an S3 endpoint behind a partition or an
overloaded gateway does. Without the bounds, botocore waits 60 s for each read and s3fs and
botocore retry it (5 and 5 times): minutes per chunk (the probe in docs/reliability.md).
"""

from __future__ import annotations

import socketserver
import threading
import time

import pytest

from agents.dlrm import raw
from tests.support.bounded_call import bounded_call
from tests.support.stalling_tcp import StallingServer

moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra)")
pytest.importorskip("s3fs", reason="s3fs (the s3 extra)")

BUCKET = "stalling"
# Short bounds, so the test is quick; the defaults are 10/30/60 s and 4 attempts.
TIMEOUTS = raw.StoreTimeouts(connect_s=1, read_s=1, request_s=1.5, attempts=2, backoff_s=0.1)
# Two attempts of 1.5 s, a wait of at most 0.2 s, the loop's second: well under this.
WITHIN_S = 6.0


@pytest.fixture
def store(tmp_path, monkeypatch):
    """moto behind the stalling proxy, with one plain and one many-member gzip object."""
    import gzip

    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = StallingServer(upstream=server.get_host_and_port())
    options = {
        "endpoint_url": f"http://127.0.0.1:{proxy.port}",
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    fs = raw.filesystem("s3://", options, TIMEOUTS)
    if not fs.exists(BUCKET):  # moto's state outlives its server, within one process
        fs.mkdir(BUCKET)
    line = "\t".join(["1", *["5"] * 13, *["0a1b2c3d"] * 26])
    text = ("\n".join([line] * 40) + "\n").encode()
    fs.pipe_file(f"{BUCKET}/days/day_0.tsv", text)
    fs.pipe_file(f"{BUCKET}/days/day_1.gz", gzip.compress(text) + gzip.compress(text))
    yield proxy, options
    proxy.close()
    server.stop()


def _bounded_call(fn):
    """``fn`` under the test's own bound, 3 * WITHIN_S (``bounded_call``)."""
    return bounded_call(fn, 3 * WITHIN_S, "the read still waits on the stalled store")


def test_reads_and_listings_of_a_stalled_store_fail_within_their_bounds_naming_the_url(store):
    proxy, options = store
    url = f"s3://{BUCKET}/days"
    index = raw.load_or_build_index(url, 16, options, TIMEOUTS)  # the store answers
    plain = next(c for c in index.chunks if not c.compressed)
    member = next(c for c in index.chunks if c.compressed and c.start > 0)
    reader = raw.RawReader(storage_options=options, store_timeouts=TIMEOUTS)
    assert reader(plain)["text"]  # the same handle, before the stall

    proxy.stall()
    what = {
        plain: f"could not read bytes {plain.start}-{plain.start + plain.length} of {plain.path}",
        # ranged reads of its members from the first it spans (its size is known from the listing)
        member: f"could not read bytes {member.member_offset}-",
    }
    for chunk in (plain, member):  # a ranged GET; a gzip member's ranged reads
        fresh = raw.RawReader(storage_options=options, store_timeouts=TIMEOUTS)
        outcome = _bounded_call(lambda chunk=chunk, fresh=fresh: fresh(chunk))
        error = outcome.get("error")
        assert isinstance(error, raw.StoreError), outcome
        assert outcome["seconds"] < WITHIN_S, outcome
        assert what[chunk] in str(error) and chunk.path in str(error)
        assert "2 attempt(s)" in str(error)
        assert "check that it is up and reachable" in str(error)

    outcome = _bounded_call(lambda: raw.store_files(url + "/", options, TIMEOUTS))
    assert isinstance(outcome.get("error"), raw.StoreError), outcome
    assert outcome["seconds"] < WITHIN_S
    assert f"could not list {url}/" in str(outcome["error"])


def test_an_s3_handle_carries_the_bounds_and_makes_one_attempt_per_request(store):
    _, options = store
    default = raw.filesystem("s3://", options)
    fs = raw.filesystem("s3://", options, TIMEOUTS)
    assert fs is not default  # handles with other bounds are not shared
    # botocore's own defaults would be 60 s, 60 s and a retried read.
    assert default.config_kwargs["connect_timeout"] == raw.DEFAULT_STORE_TIMEOUTS.connect_s == 10
    assert default.config_kwargs["read_timeout"] == raw.DEFAULT_STORE_TIMEOUTS.read_s == 30
    assert fs.config_kwargs["read_timeout"] == 1 and fs.retries == 1
    assert fs.config_kwargs["retries"] == {"total_max_attempts": 1, "mode": "standard"}
    # A caller's own config wins.
    own = raw.filesystem("s3://", {**options, "config_kwargs": {"read_timeout": 7}})
    assert own.config_kwargs["read_timeout"] == 7 and own.config_kwargs["connect_timeout"] == 10


class _Trickle(socketserver.BaseRequestHandler):
    """An S3 endpoint that answers every request with a 200 and a 4 KB body, one byte every
    0.2 s: each byte comes within any read timeout, the whole answer in 14 minutes."""

    def handle(self) -> None:
        self.request.settimeout(5)
        try:
            self.request.recv(65536)
            self.request.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n"
                b"Content-Type: binary/octet-stream\r\n\r\n"
            )
            for _ in range(4096):
                if self.server.done.is_set():
                    return
                self.request.sendall(b"1")
                time.sleep(0.2)
        except OSError:
            return


def test_a_store_that_trickles_its_answer_is_cut_at_the_request_deadline():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    server.done = threading.Event()
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
    ).start()
    options = {
        "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}",
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    chunk = raw.RawChunk("s3://trickle/days/day_0.tsv", 0, 4096, 16, 1, False)
    try:
        reader = raw.RawReader(storage_options=options, store_timeouts=TIMEOUTS)
        outcome = _bounded_call(lambda: reader(chunk))
    finally:
        server.done.set()
        server.shutdown()
        server.server_close()
    assert isinstance(outcome.get("error"), raw.StoreError), outcome
    assert outcome["seconds"] < WITHIN_S, outcome
    assert "could not read bytes 0-4096 of s3://trickle/days/day_0.tsv" in str(outcome["error"])
    assert "no answer within 1.5 s" in str(outcome["error"])


def test_a_file_with_no_suffix_is_looked_at_in_one_bounded_get(store, monkeypatch):
    # Spark's part-00000 is read by its first bytes: one ranged GET, cut at its bounds.
    proxy, options = store
    fs = raw.filesystem("s3://", options, TIMEOUTS)
    text = fs.cat_file(f"{BUCKET}/days/day_0.tsv") * 4  # 42 kB: more than is looked at
    fs.pipe_file(f"{BUCKET}/spark/part-00000", text)
    fs.pipe_file(f"{BUCKET}/spark/_SUCCESS", b"")
    url = f"s3://{BUCKET}/spark"
    gets = []
    bounded = raw._bounded
    monkeypatch.setattr(raw, "_bounded", lambda fs, url, what, call, *args, **kwargs: (
        gets.append((call, url, kwargs.get("start"), kwargs.get("end"))) or
        bounded(fs, url, what, call, *args, **kwargs)))  # fmt: skip
    listed = raw.list_tree(url, options, TIMEOUTS, data=lambda entry: True)
    assert [(f["name"], f.get("content")) for f in listed] == [("part-00000", "text")]
    looked = [g for g in gets if g[0] == "cat_file"]
    assert looked == [("cat_file", f"{url}/part-00000", 0, raw.SNIFF_BYTES)]
    assert len(text) > raw.SNIFF_BYTES

    proxy.stall()
    entry = {**listed[0], "etag": "another"}  # not the one looked at already
    del entry["content"]
    outcome = _bounded_call(lambda: raw.sniff([entry], options, TIMEOUTS))
    assert isinstance(outcome.get("error"), raw.StoreError), outcome
    assert outcome["seconds"] < WITHIN_S, outcome
    assert f"could not read the first bytes of {url}/part-00000" in str(outcome["error"])
