"""A rank's place on its host comes from whichever launcher started it: torchrun's LOCAL_RANK
and LOCAL_WORLD_SIZE, Open MPI's, MVAPICH2's, MPICH's or SLURM's own variables. Before, only
torchrun's were read, so the ranks of an ``srun`` or ``mpirun`` job each took themselves for
rank 0 of 1, a host of its own."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.daemon.ranks import LAUNCHER_ENV, local_rank_and_world

EVERY_NAME = {name for pair in LAUNCHER_ENV for name in pair} | {
    "SLURM_TASKS_PER_NODE", "SLURM_NODEID",
}  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch):
    for name in EVERY_NAME:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# The fixture clears the variables once; each example sets its own and undoes them.
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    family=st.sampled_from(LAUNCHER_ENV),
    size=st.integers(1, 16),
    data=st.data(),
    # A family read later may be set too (torchrun inside a SLURM allocation): the first wins.
    later=st.booleans(),
)
def test_each_launchers_rank_and_size_are_read(clean_env, family, size, data, later):
    rank = data.draw(st.integers(0, size - 1))
    index = LAUNCHER_ENV.index(family)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(family[0], str(rank))
        env.setenv(family[1], str(size))
        if later and index + 1 < len(LAUNCHER_ENV):
            other = LAUNCHER_ENV[index + 1]
            env.setenv(other[0], str(size + 5))
            env.setenv(other[1], str(size + 9))
        assert local_rank_and_world() == (rank, size)
        # Arguments win over every variable.
        assert local_rank_and_world(0, 1) == (0, 1)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    groups=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 4)), min_size=1, max_size=4),
    data=st.data(),
)
def test_srun_without_ntasks_per_node_reads_this_nodes_count(clean_env, groups, data):
    """SLURM_TASKS_PER_NODE is ``2(x3),1``: 2 tasks on each of the first 3 nodes, then 1."""
    per_node = [count for count, times in groups for _ in range(times)]
    spec = ",".join(f"{c}(x{t})" if t > 1 else str(c) for c, t in groups)
    node = data.draw(st.integers(0, len(per_node) - 1))
    rank = data.draw(st.integers(0, per_node[node] - 1))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLURM_LOCALID", str(rank))
        env.setenv("SLURM_TASKS_PER_NODE", spec)
        env.setenv("SLURM_NODEID", str(node))
        assert local_rank_and_world() == (rank, per_node[node])


def test_no_launcher_is_rank_0_of_1(clean_env):
    assert local_rank_and_world() == (0, 1)


def test_lightnings_launcher_gets_a_reason_that_names_the_variable_to_export(clean_env):
    """Lightning's own DDP launcher sets LOCAL_RANK and not LOCAL_WORLD_SIZE."""
    clean_env.setenv("LOCAL_RANK", "1")
    with pytest.raises(ValueError, match="export LOCAL_WORLD_SIZE"):
        local_rank_and_world()


def test_a_launchers_value_that_is_not_a_number_is_named(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "four")
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_LOCAL_SIZE='four' is not a whole"):
        local_rank_and_world()
