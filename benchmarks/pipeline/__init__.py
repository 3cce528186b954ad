"""Benchmarks of the pipeline runtime (``python -m benchmarks.pipeline``); see
``benchmarks.pipeline.cli``."""
