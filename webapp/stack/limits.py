"""The open-file limit of a process that holds a connection per agent.

A web worker holds a file descriptor per open connection: every agent's held allocation
long-poll and its batches' keep-alive connection, so 2,000 agents are about 4,000 descriptors
across the workers, one worker possibly holding most of them. The usual soft limit (1,024 under
systemd and many shells) would make a worker fail its accepts with EMFILE at about 500 agents,
while the hard limit is far higher (524,288 under systemd). The web service's master raises it
before it starts its workers (webapp/gunicorn_conf.py), and the load generator does the same.
"""

import resource


def raise_open_file_limit(needed: int = 0) -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (the processes it starts
    inherit it). Returns the soft limit now in force; raises RuntimeError, saying what to do,
    when even the hard limit is below ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < needed:
        raise RuntimeError(
            f"this needs about {needed} open files in one process but the hard limit is "
            f"{hard}: raise it (ulimit -Hn, LimitNOFILE= in a systemd unit, nofile in "
            "limits.conf or docker's --ulimit), or spread the load over more processes"
        )
    return soft
