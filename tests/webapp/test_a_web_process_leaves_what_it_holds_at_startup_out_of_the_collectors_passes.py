"""A web process freezes what it holds once started (``gc.freeze()`` at the ASGI lifespan's
startup, webapp/agent_asgi.py): Django, the apps and the settings stay for the process's whole
life, and every full pass of the garbage collector walked them again (the collector was 5.5% of
the web processes' CPU in step; docs/benchmarks.md)."""

import asyncio
import gc
import signal

from webapp.agent_asgi import AgentFront


def test_the_lifespans_startup_freezes_the_heap_it_started_with():
    async def django(scope, receive, send):
        raise AssertionError("no request in this test")

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    front = AgentFront(django, threads=2)
    front.waker.start = lambda: None  # no Redis subscription: the startup alone is tested
    gc.unfreeze()
    messages = [{"type": "lifespan.shutdown"}, {"type": "lifespan.startup"}]
    frozen = []

    async def receive():
        return messages.pop()

    async def send(message):
        if message["type"] == "lifespan.startup.complete":
            frozen.append(gc.get_freeze_count())

    try:
        asyncio.run(asyncio.wait_for(front({"type": "lifespan"}, receive, send), timeout=20))
    finally:
        gc.unfreeze()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        front.pool.shutdown(wait=True)
    # Most of what the process holds is frozen: a test process holds at least Django's
    # modules, tens of thousands of objects.
    assert frozen and frozen[0] > 10_000, frozen
