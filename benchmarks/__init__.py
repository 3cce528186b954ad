"""Benchmarks and load generators: they measure the system; nothing of the runtime imports them.

Run from the repository root (``make bench`` runs the first):

- ``python -m benchmarks.pipeline``: the pipeline runtime (scaling with cores, layouts,
  DataLoader side by side, live-resize latency);
- ``python -m benchmarks.agent_overhead``: the agent's CPU cost at 1 Hz;
- ``python -m benchmarks.loadgen``: simulated agents streaming metrics at a control plane;
- ``python -m benchmarks.allocation_latency``: from a stored allocation to the agent applying it;
- ``python -m benchmarks.online_tuning``: InTune on this host's DLRM pipeline against the best
  allocation;
- ``python -m benchmarks.dashboard``: the job page's server time on a day of samples;
- ``python -m benchmarks.io_budget``: the I/O-bound pipeline's best allocation under the old
  and the new worker budget;
- ``python -m benchmarks.dataloader``: ``agents.torch.DataLoader`` against torch's DataLoader.
- ``python -m benchmarks.web_tiers``: the uvicorn and gthread web tiers side by side, and the
  memory per held long-poll; ``python -m benchmarks.ingestion_cpu``: CPU per metrics batch;
- ``python -m benchmarks.ranks`` and ``python -m benchmarks.rank_balance``: two ranks on one host;
- ``python -m benchmarks.sampling``: what one agent sample of a running pipeline costs.

``benchmarks.ingestion_host`` holds what the in-process ingestion benchmarks share.

Figures and the exact commands are in docs/benchmarks.md. The stacks they start come from
``tests.support`` (the live stack, the stand-in control plane), which the tests use too.
"""
