"""The front hunter (tests/http_clients/front_hunt.py) in the suite: a few of its cheap cases and
the replays of the cases it found, on one live stack of their own (a replay may ``kill -9`` the
web server, which the package's shared stack must not see). A longer hunt is run by hand:
``python -m tests.http_clients.front_hunt --cases N --seed S``."""

import json

import pytest

from tests.http_clients.front_hunt import hunt

pytestmark = pytest.mark.slow

# Seeds whose cases take a few seconds and mix the kinds of bad client (seed: its clients).
CHEAP = [
    305,  # duplicate and out-of-order batches, twice
    306,  # wrong headers, odd JSON, gzip, a request cut at a random byte
    314,  # an oversized head or body, a chunked body
]
# Cases the hunter found, each with what it found (the fix's test names it too).
REPLAYS = {
    219: "kill -9 of gunicorn's master left its uvicorn worker serving, orphaned, for ever "
    "(webapp/stack/web_worker.py, BoundedUvicornWorker.init_process)",
}


def test_the_front_hunters_cheap_cases_and_its_replays_hold(tmp_path, redis_url):
    tally = hunt(CHEAP + list(REPLAYS), tmp_path)
    assert tally["cases"] == len(CHEAP) + len(REPLAYS)
    assert not tally["found"], json.dumps(tally["found"], indent=1)[:6000]
