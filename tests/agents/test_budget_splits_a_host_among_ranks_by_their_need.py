"""The host agent splits the host's workers among its ranks by what each measured it needs
(agents.budget.split_across_ranks): the total per stage is the host's, never more, every rank
keeps at least one worker per stage, and ranks that measure alike get the same."""

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.budget import rank_need, split_across_ranks

STAGES = ["read", "decode", "collate"]

allocations = st.fixed_dictionaries({s: st.integers(1, 40) for s in STAGES})
needs = st.dictionaries(
    st.integers(0, 7),
    st.dictionaries(st.sampled_from(STAGES), st.floats(0, 50, allow_nan=False)),
    min_size=1,
    max_size=8,
)
bounds = st.dictionaries(st.sampled_from(STAGES), st.none() | st.integers(1, 40))


@settings(max_examples=400, deadline=None)
@given(allocations, needs, bounds)
def test_a_split_never_exceeds_the_host_and_gives_every_rank_a_worker_per_stage(
    workers, measured, max_workers
):
    split = split_across_ranks(workers, measured, max_workers)
    assert sorted(split) == sorted(measured)
    for stage, per_rank in workers.items():
        counts = [split[rank][stage] for rank in split]
        assert all(count >= 1 for count in counts)
        assert sum(counts) <= per_rank * len(measured), "never more than the host's total"
        cap = max_workers.get(stage)
        if cap:
            assert all(count <= max(cap, 1) for count in counts)
        else:
            assert sum(counts) == per_rank * len(measured), "the host's total, all used"


@settings(max_examples=200, deadline=None)
@given(allocations, st.integers(1, 8), st.dictionaries(st.sampled_from(STAGES), st.floats(0, 50)))
def test_ranks_that_measure_alike_get_the_allocation_each(workers, ranks, need):
    split = split_across_ranks(workers, {rank: dict(need) for rank in range(ranks)})
    assert split == {rank: dict(workers) for rank in range(ranks)}


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 30), st.floats(0.1, 10), st.floats(1.0, 10))
def test_the_rank_that_needs_more_gets_more(per_rank, light, ratio):
    split = split_across_ranks(
        {"decode": per_rank}, {0: {"decode": light}, 1: {"decode": light * ratio}}
    )
    assert split[1]["decode"] >= split[0]["decode"]
    assert split[0]["decode"] + split[1]["decode"] == 2 * per_rank


def test_a_rank_three_times_as_busy_gets_three_times_the_workers():
    busy = {0: rank_need([{"name": "decode", "workers": 4, "busy_fraction": 0.25}]),
            1: rank_need([{"name": "decode", "workers": 4, "busy_fraction": 0.75}])}  # fmt: skip
    assert busy == {0: {"decode": 1.0}, 1: {"decode": 3.0}}
    assert split_across_ranks({"decode": 4}, busy) == {0: {"decode": 2}, 1: {"decode": 6}}


def test_a_rank_not_measured_yet_counts_as_the_mean_of_the_others():
    split = split_across_ranks({"decode": 3}, {0: {"decode": 2.0}, 1: {}, 2: {"decode": 2.0}})
    assert split == {rank: {"decode": 3} for rank in range(3)}


def test_a_stage_bound_sends_the_rest_to_the_other_ranks():
    split = split_across_ranks({"decode": 4}, {0: {"decode": 1}, 1: {"decode": 9}}, {"decode": 5})
    assert split == {0: {"decode": 3}, 1: {"decode": 5}}


def test_ranks_within_the_noise_of_each_other_split_evenly():
    assert split_across_ranks({"decode": 6}, {0: {"decode": 2.0}, 1: {"decode": 2.9}}) == {
        0: {"decode": 6},
        1: {"decode": 6},
    }
