"""The agent protocol's limits (docs/agent-protocol.md), one definition for every side of it.

The agent sizes its batches by them, the web app refuses what exceeds them (its defaults, which
``INTUNE_MAX_SAMPLES_PER_BATCH`` and ``INTUNE_MAX_BODY_BYTES`` may change), and the tests'
stand-in control plane enforces them as the web app does. Plain constants: the web app imports
this module without importing anything else of ``agents``.
"""

MAX_SAMPLES_PER_BATCH = 600
"""Most samples in one metrics batch."""

MAX_BODY_BYTES = 2**20
"""Most bytes in one request body (1 MiB)."""
