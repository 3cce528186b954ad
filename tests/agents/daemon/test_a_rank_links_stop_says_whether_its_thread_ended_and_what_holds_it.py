"""A rank's ``RankLink.stop(timeout_s)`` returns within its bound and says whether the link's
thread has ended; when the thread is held inside a call a stop cannot cut (the pipeline's
``apply`` or ``metrics``, the ``host_here`` that starts the host agent), it returns ``False``
and its warning names that call, and a later stop, once the call has returned, returns
``True`` with the thread gone (and the host agent that ``host_here`` started stopped).

Found from the generated rank-moves test (1 failure in 288 soak runs, load 9 to 14): a muted
rank's stand-in ``apply`` held the link's thread past its ``stop(2.0)``, which returned
``None`` as if done (2.0 s every time: the rank mute, allocation, leave case), and the test's
end found the thread still alive when the mute's release had not yet let it finish. A stop
also waited without bound for a ``host_here`` in progress (the hosting lock). Generated: which
call holds the thread, and the stop's bound."""

from __future__ import annotations

import logging
import threading
import time
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.daemon.ranks import HostPipelines, RankLink
from tests.agents.pipeline.stress import bounded

STAGES = ["read", "parse"]
HOLD_S = 10.0  # the longest a held call lasts (released by the test well before)
SLACK_S = 1.5  # what a stop may take beyond its bound on a loaded 2-core machine


class HeldPipeline:
    """A pipeline whose ``apply`` or ``metrics`` blocks, once armed, until released."""

    def __init__(self) -> None:
        self.stage_names = list(STAGES)
        self.allocation = dict.fromkeys(STAGES, 1)
        self.hold: str | None = None
        self.entered = threading.Event()
        self.release = threading.Event()

    def _held(self, call: str) -> None:
        if self.hold == call:
            self.entered.set()
            self.release.wait(HOLD_S)

    def apply(self, allocation: dict[str, int]) -> None:
        self._held("apply")
        self.allocation = dict(allocation)

    def metrics(self) -> list[dict]:
        self._held("metrics")
        return [{"name": name, "workers": n} for name, n in self.allocation.items()]


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Hosted:
    def __init__(self, hub: HostPipelines) -> None:
        self.hub = hub

    def stop(self) -> None:
        self.hub.stop()


@settings(max_examples=6, deadline=None)
@given(hold=st.sampled_from(["apply", "metrics", "host_here"]), bound=st.sampled_from([0.2, 0.6]))
def test_a_links_stop_says_whether_its_thread_ended_and_what_holds_it(hold, bound):
    pipeline = HeldPipeline()
    hubs: list[HostPipelines] = []
    in_host_here = threading.Event()

    def host_here(listener) -> Hosted:
        if hold == "host_here":
            in_host_here.set()
            pipeline.release.wait(HOLD_S)
        hub = HostPipelines(listener, 1, interval_s=0.1, apply_timeout_s=0.5, rebalance_s=None)
        hubs.append(hub)
        return Hosted(hub.start())

    warnings = Warnings()
    logger = logging.getLogger("agents.daemon.ranks")
    logger.addHandler(warnings)
    link = RankLink(
        pipeline, 0, 1, f"\0intune-test-{uuid.uuid4().hex}", trainer_stats=dict,
        host_here=host_here, interval_s=0.1,
    )  # fmt: skip
    try:
        link.start()
        if hold == "host_here":
            assert in_host_here.wait(10), "the link never started to host the agent"
        else:
            assert link.connected.wait(10), "the link never reached its host agent"
            pipeline.hold = hold
            if hold == "apply":
                assert hubs[0].wait_for_stages(10), "the rank's hello never reached its hub"
                threading.Thread(
                    target=hubs[0].apply, args=({"read": 2, "parse": 2},), daemon=True
                ).start()
        assert hold == "host_here" or pipeline.entered.wait(10), f"{hold} was never called"

        ended, took = bounded(f"a stop held by {hold}", bound + SLACK_S + 2, link.stop, bound)
        assert took < bound + SLACK_S, f"stop({bound}) took {took:.2f} s"
        assert ended is False, f"stop() returned {ended!r} with its thread held in {hold}"
        said = " ".join(warnings.lines)
        assert "did not end" in said or "did not wait" in said, said
        assert hold in said, f"the stop's warning does not name {hold}: {said}"

        pipeline.release.set()
        ended, _ = bounded("the stop once released", 5.0, link.stop, 3.0)
        assert ended is True, f"stop() returned {ended!r} once {hold} had returned"
        assert not link._thread.is_alive()
        deadline = time.monotonic() + 3.0
        while any(not hub._stop.is_set() for hub in hubs) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(hub._stop.is_set() for hub in hubs), "the host agent started was not stopped"
        assert link.hosted is None
    finally:
        pipeline.release.set()
        logger.removeHandler(warnings)
        link.stop(3.0)
        for hub in hubs:
            hub.stop()
