"""The web service's workers hold a descriptor per agent connection: they run with the hard
open-file limit, whatever soft limit the service was started under (webapp/stack/limits.py)."""

import resource

import psutil
import pytest

from tests.support.live_stack import LiveStack
from webapp.stack.limits import raise_open_file_limit

pytestmark = pytest.mark.slow


def test_web_workers_started_under_a_low_soft_limit_run_with_the_hard_one(tmp_path, redis_url):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(512, hard)
    if low == hard:
        pytest.skip(f"the hard open-file limit is {hard}: no room to start below it")
    stack = LiveStack(tmp_path / "limits", manage_shell=False)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        stack.start()  # the web service inherits the low soft limit
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        master = psutil.Process(stack.group.children["web"].pid)
        assert master.rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)
        workers = master.children()
        assert workers
        for worker in workers:
            assert worker.rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)
    finally:
        stack.stop()


def test_a_need_beyond_the_hard_limit_is_refused_with_what_to_do():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        assert raise_open_file_limit(100) == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        with pytest.raises(RuntimeError, match="raise it"):
            raise_open_file_limit(hard + 1)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
