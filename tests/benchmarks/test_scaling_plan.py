"""How the scaling benchmark plans its work on hosts of any size."""

from benchmarks.pipeline.measure import default_core_counts, proportional_allocation


def test_core_counts_are_every_count_on_a_small_host_and_doubling_on_a_big_one():
    assert default_core_counts(1) == [1]
    assert default_core_counts(2) == [1, 2]
    assert default_core_counts(4) == [1, 2, 3, 4]
    assert default_core_counts(48) == [1, 2, 3, 4, 8, 16, 32, 48]


def test_a_big_hosts_climb_starts_from_cores_shared_by_busy_time():
    busy = {"read": 0.2, "parse": 0.7, "transform": 0.05, "collate": 0.05}
    assert proportional_allocation(busy, 32) == {
        "read": 6, "parse": 22, "transform": 2, "collate": 2,
    }  # fmt: skip
    # Every stage keeps a worker, however idle.
    assert proportional_allocation({"a": 1.0, "b": 0.0}, 4) == {"a": 4, "b": 1}
