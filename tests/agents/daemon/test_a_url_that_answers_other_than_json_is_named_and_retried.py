"""A URL that reaches something other than the control plane (another server, a proxy's or
a login page) answers 200 with HTML, or JSON that is not an object: ``attach()`` says so and
starts anyway, and the agent keeps polling with backoff. Before, ``attach()`` raised a bare
"JSONDecodeError: Expecting value: line 1 column 1 (char 0)", and a JSON list killed the
agent's poll thread with an AttributeError (no allocation was ever applied after)."""

import http.server
import logging
import threading
import time

import pytest

from agents import attach
from agents.client import ControlPlaneClient, ControlPlaneError
from agents.pipeline import Pipeline, Stage

ANSWERS = {
    "html": ("text/html", b"<html><body>Sign in to continue</body></html>"),
    "json-list": ("application/json", b"[]"),
}


def _serve(kind: str) -> http.server.ThreadingHTTPServer:
    content_type, body = ANSWERS[kind]

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_an_answer_that_is_not_a_json_object_is_named_and_retried(kind, caplog):
    server = _serve(kind)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = ControlPlaneClient(url, 1, "ia_test", timeout_s=5.0)
        with pytest.raises(ControlPlaneError, match="not the control plane's JSON object") as e:
            client.poll_allocation(after=0, wait_s=0)
        assert e.value.retryable
        with pytest.raises(ControlPlaneError, match="check the URL"):
            client.post_metrics({"samples": []})
        client.close()

        pipeline = Pipeline(range(50), [Stage("a", abs, kind="thread")])
        with caplog.at_level(logging.WARNING, logger="agents"):
            agent = attach(pipeline, url=url, host_id=1, token="ia_test", interval_s=0.2)
            try:
                with pipeline:
                    assert list(pipeline) == list(range(50))
                # The poll thread goes on retrying: its failures are logged again and again.
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline:
                    polls = [
                        r
                        for r in caplog.records
                        if "polling for allocations" in r.getMessage()
                        and "not the control plane's JSON object" in r.getMessage()
                    ]
                    if len(polls) >= 2:
                        break
                    time.sleep(0.1)
                assert len(polls) >= 2, [r.getMessage() for r in caplog.records]
            finally:
                agent.stop()
        assert any("starting anyway" in r.getMessage() for r in caplog.records)
    finally:
        server.shutdown()
        server.server_close()
