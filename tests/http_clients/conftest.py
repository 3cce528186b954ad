"""One live control plane for the package: a real gunicorn with its uvicorn worker, driven by
raw sockets, curl, urllib and requests (tests/support/raw_http.py, agent_requests.py)."""

import pytest

from tests.support.agent_requests import agent_plane
from tests.support.raw_http import open_connections, settles, web_worker


@pytest.fixture(scope="package")
def plane(tmp_path_factory, redis_url):
    with agent_plane(tmp_path_factory.mktemp("http-clients")) as shared:
        yield shared


@pytest.fixture(scope="package")
def worker(plane):
    return web_worker(plane.stack.group.children["web"].pid)


@pytest.fixture
def baseline(plane, worker) -> int:
    """The worker's open connections once every earlier test's have gone (bounded: 10 s)."""
    return settles(lambda: open_connections(worker, plane.port), 0, 10)
