"""A control plane whose state went back (its database restored from an older backup) has a
newest allocation version below the one the agent holds. Polls ``after`` the agent's version
were held until the control plane's versions caught up, and every allocation it published
until then was ignored as not newer. Now a batch's answer naming a newest version below one
the agent held before it sent the batch makes the agent follow the control plane from there.
(The stand-in control plane: its state can be set back in place, which a live stack's can
only be by restoring a database dump; the agent's side is the same.)"""

from .conftest import refusals


def test_after_a_restore_the_agent_takes_the_control_planes_allocations_again(
    agent, control_plane, pipeline, wait_for
):
    agent, host = agent
    for workers in ({"parse": 2, "transform": 1}, {"parse": 1, "transform": 2}):
        version = control_plane.publish(host.id, workers)
        wait_for(lambda v=version: agent.applied_version == v, what=f"version {version} applied")
    assert agent.applied_version == 3

    with control_plane.changed:  # the restore: only version 1 is left
        del host.allocations[1:]
    # The restored control plane's next allocation is version 2, below the 3 the agent holds.
    version = control_plane.publish(host.id, {"parse": 3, "transform": 1})
    assert version == 2
    wait_for(
        lambda: agent.applied_version == 2 and pipeline.allocation == {"parse": 3, "transform": 1},
        timeout=20,
        what="the restored control plane's version 2 applied",
    )
    assert 2 not in refusals(host)
    wait_for(
        lambda: host.statuses and host.statuses[-1].get("applied_version") == 2,
        timeout=10,
        what="version 2 reported applied",
    )
