"""The dashboard's benchmark (``python -m benchmarks.dashboard``) and the synthetic history it
fills a host with."""
