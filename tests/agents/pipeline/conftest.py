"""Fixtures of the pipeline runtime's tests."""

import pytest

from agents.pipeline import shm


@pytest.fixture(autouse=True)
def _shared_memory_pool_released():
    """A test that packs in the test process (``shm.pack``) leaves that process's pooled
    files behind otherwise: a worker releases its pool when it exits, the test process only at
    the end of the run, which never comes for the pool (files in /dev/shm after every run)."""
    yield
    shm.release_pool()
