"""A launcher that dies with requests it has not read still says what it raised. The kernel
reports such a death (``ECONNRESET``) once, at the first read, before the launcher's crash
report that waits behind it: that first error ended the pipeline's reading, so the crash
text was lost ("exited with code 1" and no cause in ``LauncherFailed``) whenever the
pipeline asked for workers without waiting for the answers (the monitor's replacements)."""

from __future__ import annotations

import time

import pytest

from agents.pipeline import zygote
from agents.pipeline.zygote import LauncherGone, Zygote


def _dies_after_a_while(*args, **kwargs):
    time.sleep(0.3)  # the requests come in meanwhile, and stay unread
    raise RuntimeError("no room for a launcher (test)")


@pytest.mark.parametrize("reader", ["answer", "how_it_ended"])
def test_the_crash_text_is_read_behind_the_reset(monkeypatch, reader):
    monkeypatch.setattr(zygote, "_launcher", _dies_after_a_while)
    launcher = Zygote(lambda *args: None, None, None)
    opened: list[int] = []
    try:
        request = {"stage_index": 0, "slot": 0, "affinity": None, "status_index": (0, 0)}
        numbers = []
        for _ in range(2):
            number, items_w, results_r = launcher.request(request)
            numbers.append(number)
            opened += [items_w, results_r]
        deadline = time.monotonic() + 10.0
        while launcher.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not launcher.alive(), "the launcher did not die within 10 s"
        if reader == "answer":
            with pytest.raises(LauncherGone, match="no room for a launcher"):
                launcher.answer(numbers[0], 0.0)
        how = launcher.how_it_ended()
        assert how == "exited with code 1: RuntimeError: no room for a launcher (test)", how
        assert "Traceback" in launcher.crash
    finally:
        for fd in opened:
            zygote._close(fd)
        launcher.close()
