"""What the tests and the benchmarks start and talk to: a whole control plane in child
processes (``live_stack``) and an in-memory stand-in of it (``standin_control_plane``)."""
