"""Host sampling is cgroup-aware: inside a container the CPU quota and memory limit of the
cgroup (v2 cpu.max / memory.max, v1 cfs quota / limit_in_bytes) bound what the host offers.
The cgroup trees here are real files in a temporary directory laid out as the kernel does."""

import os

import pytest

from agents.host import (
    HostSampler,
    available_cpus,
    cgroup_cpu_limit,
    cgroup_memory_limit_bytes,
    cgroup_memory_used_bytes,
)

V2_SELF = "0::/kubepods/pod1/trainer\n"
V1_SELF = "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n1:cpuset:/\n"


def write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def v2(tmp_path):
    write(tmp_path, "cgroup.controllers", "cpu memory")
    write(tmp_path, "kubepods/pod1/cpu.max", "400000 100000")
    write(tmp_path, "kubepods/pod1/trainer/cpu.max", "150000 100000")
    write(tmp_path, "kubepods/pod1/memory.max", str(8 * 2**30))
    write(tmp_path, "kubepods/pod1/trainer/memory.max", "max")
    return tmp_path


@pytest.fixture
def v1(tmp_path):
    write(tmp_path, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000")
    write(tmp_path, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000")
    write(tmp_path, "cpu,cpuacct/cpu.cfs_quota_us", "-1")
    write(tmp_path, "cpu,cpuacct/cpu.cfs_period_us", "100000")
    write(tmp_path, "memory/docker/abc/memory.limit_in_bytes", str(3 * 2**30))
    write(tmp_path, "memory/memory.limit_in_bytes", "9223372036854771712")
    return tmp_path


def test_v2_takes_the_tightest_quota_along_the_path(v2):
    assert cgroup_cpu_limit(v2, V2_SELF) == 1.5


def test_v2_memory_limit_is_inherited_from_an_ancestor(v2):
    assert cgroup_memory_limit_bytes(v2, V2_SELF) == 8 * 2**30


def test_v2_without_limits_is_unlimited(tmp_path):
    write(tmp_path, "cgroup.controllers", "cpu memory")
    write(tmp_path, "cpu.max", "max 100000")
    write(tmp_path, "memory.max", "max")
    assert cgroup_cpu_limit(tmp_path, "0::/\n") is None
    assert cgroup_memory_limit_bytes(tmp_path, "0::/\n") is None


def test_v1_reads_cfs_quota_and_memory_limit(v1):
    assert cgroup_cpu_limit(v1, V1_SELF) == 2.5
    assert cgroup_memory_limit_bytes(v1, V1_SELF) == 3 * 2**30


def test_v1_huge_memory_limit_and_minus_one_quota_mean_unlimited(v1):
    assert cgroup_cpu_limit(v1, "2:cpu,cpuacct:/\n") is None
    assert cgroup_memory_limit_bytes(v1, "4:memory:/\n") is None


def test_a_namespaced_path_that_is_not_mounted_falls_back_to_the_root(tmp_path):
    write(tmp_path, "cgroup.controllers", "cpu")
    write(tmp_path, "cpu.max", "50000 100000")
    assert cgroup_cpu_limit(tmp_path, "0::/hidden/by/namespace\n") == 0.5


def test_available_cpus_is_the_least_of_affinity_and_quota(v2):
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(v2, V2_SELF) == min(affinity, 1.5)


def test_a_live_sample_has_the_protocols_host_fields_in_range():
    sampler = HostSampler()
    sample = sampler.sample(worker_budget=7)
    assert sample["cpus"] >= 0.01
    assert 0 <= sample["cpu_percent"] <= 100
    assert len(sample["per_cpu_percent"]) == len(os.sched_getaffinity(0))
    assert 0 < sample["memory_used_mb"] <= sample["memory_limit_mb"] * 1.05
    assert sample["worker_budget"] == 7


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_memory_used_in_a_cgroup_leaves_out_the_page_cache_the_kernel_can_take_back(
    tmp_path, version
):
    """A job streaming its data from files fills its cgroup's page cache up to the limit: the
    usage the kernel reports counts it, the working set (the kubelet's) does not. Before, a
    container reading its shards read as full."""
    gib = 2**30
    if version == "v2":
        write(tmp_path, "cgroup.controllers", "cpu memory")
        write(tmp_path, "kubepods/pod1/trainer/memory.max", str(8 * gib))
        write(tmp_path, "kubepods/pod1/trainer/memory.current", str(8 * gib - 4096))
        stat = f"anon {2 * gib}\nfile {6 * gib}\nactive_file {gib}\ninactive_file {5 * gib}\n"
        write(tmp_path, "kubepods/pod1/trainer/memory.stat", stat)
        own = V2_SELF
    else:
        write(tmp_path, "memory/docker/abc/memory.limit_in_bytes", str(8 * gib))
        write(tmp_path, "memory/docker/abc/memory.usage_in_bytes", str(8 * gib - 4096))
        stat = f"cache 0\ninactive_file 0\ntotal_cache {6 * gib}\ntotal_inactive_file {5 * gib}\n"
        write(tmp_path, "memory/docker/abc/memory.stat", stat)
        own = V1_SELF
    assert cgroup_memory_used_bytes(tmp_path, own) == 3 * gib - 4096
    write(
        tmp_path,
        f"{'kubepods/pod1/trainer' if version == 'v2' else 'memory/docker/abc'}/memory.stat",
        "",
    )
    assert cgroup_memory_used_bytes(tmp_path, own) == 8 * gib - 4096  # nothing to leave out
