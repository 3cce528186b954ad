"""Runs the whole control plane on one machine as child processes (``make demo``): the service
commands (one definition, also for docker-compose.yml), the process supervisor and the embedded
Redis. The tests' and benchmarks' live stack (``tests.support.live_stack``) is built from them.

Nothing here is imported by the web app itself; it only starts it.
"""
