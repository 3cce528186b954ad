"""What this trainer host can give the pipeline: CPUs and memory, as the container sees them.

A process inside a container sees the whole machine through ``os.cpu_count()`` and
``/proc/meminfo``; the limits that bind it live in its cgroup (v2 ``cpu.max`` and
``memory.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` and ``memory.limit_in_bytes``)
and in its CPU affinity (cpuset). This module reads all three and reports the tightest.

Every reader takes the cgroup filesystem root and the process's ``/proc/<pid>/cgroup`` text as
arguments so that tests can point it at a fake tree; by default it reads the live system.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as a page-rounded 2**63 - 1; anything this large means unlimited.
_UNLIMITED_BYTES = 1 << 60


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_cgroup_text() -> str:
    return _read(Path("/proc/self/cgroup")) or ""


def _cgroup_dirs(root: Path, cgroup_text: str, controller: str | None) -> list[Path]:
    """Directories to inspect for one controller, from the process's own cgroup up to the root.

    ``controller=None`` asks for the v2 unified hierarchy. A limit set on any ancestor binds
    the process too, so the caller takes the minimum over all of them. When the cgroup
    namespace hides the path (the directory does not exist), the controller's root is used.
    """
    relative: str | None = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if controller is None and hierarchy == "0" and controllers == "":
            relative = path
        elif controller is not None and controller in controllers.split(","):
            relative = path
    if controller is None:
        base = root
    else:
        # v1 mounts a controller either alone ("cpu") or joined ("cpu,cpuacct").
        candidates = [root / controller] + sorted(root.glob(f"*{controller}*"))
        base = next((c for c in candidates if c.is_dir()), root / controller)
    dirs: list[Path] = []
    if relative:
        here = base / relative.lstrip("/")
        if here.is_dir():
            while True:
                dirs.append(here)
                if here == base or base not in here.parents:
                    break
                here = here.parent
    if base not in dirs:
        dirs.append(base)
    return dirs


def _is_v2(root: Path) -> bool:
    return (root / "cgroup.controllers").exists()


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, cgroup_text: str | None = None) -> float | None:
    """Return the CPUs the cgroup quota allows (e.g. ``1.5``), or ``None`` when unlimited.

    Reads v2 ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") or v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (quota ``-1`` is unlimited), and takes the tightest along the path.
    """
    text = _own_cgroup_text() if cgroup_text is None else cgroup_text
    limits: list[float] = []
    if _is_v2(root):
        for d in _cgroup_dirs(root, text, None):
            raw = _read(d / "cpu.max")
            if not raw:
                continue
            quota, _, period = raw.partition(" ")
            if quota != "max" and period:
                limits.append(int(quota) / int(period))
    else:
        for d in _cgroup_dirs(root, text, "cpu"):
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
            if quota and period and int(quota) > 0 and int(period) > 0:
                limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def cgroup_memory_limit_bytes(
    root: Path = CGROUP_ROOT, cgroup_text: str | None = None
) -> int | None:
    """Return the cgroup's memory limit in bytes, or ``None`` when unlimited.

    Reads v2 ``memory.max`` ("max" is unlimited) or v1 ``memory.limit_in_bytes`` (a value near
    2**63 is unlimited), and takes the tightest along the path.
    """
    text = _own_cgroup_text() if cgroup_text is None else cgroup_text
    name, dirs = (
        ("memory.max", _cgroup_dirs(root, text, None))
        if _is_v2(root)
        else ("memory.limit_in_bytes", _cgroup_dirs(root, text, "memory"))
    )
    limits = []
    for d in dirs:
        raw = _read(d / name)
        if raw and raw != "max" and raw.isdigit() and int(raw) < _UNLIMITED_BYTES:
            limits.append(int(raw))
    return min(limits) if limits else None


def cgroup_memory_used_bytes(
    root: Path = CGROUP_ROOT, cgroup_text: str | None = None
) -> int | None:
    """Return the memory this process's own cgroup holds that the kernel cannot simply take
    back: its working set, as the kubelet and cAdvisor count it (v2 ``memory.current``, v1
    ``memory.usage_in_bytes``, less the inactive page cache of ``memory.stat``:
    ``inactive_file``, v1 ``total_inactive_file``), or ``None`` when it cannot be read.

    The cgroup's usage counts the page cache charged to it: a job streaming its data from files
    fills it up to the limit, and the host would read as full while the kernel gives those
    pages back on demand (outside a cgroup, ``psutil``'s used memory leaves the cache out
    too)."""
    text = _own_cgroup_text() if cgroup_text is None else cgroup_text
    if _is_v2(root):
        folder = _cgroup_dirs(root, text, None)[0]
        raw, inactive_key = _read(folder / "memory.current"), "inactive_file"
    else:
        folder = _cgroup_dirs(root, text, "memory")[0]
        raw, inactive_key = _read(folder / "memory.usage_in_bytes"), "total_inactive_file"
    if not (raw and raw.isdigit()):
        return None
    inactive = 0
    for line in (_read(folder / "memory.stat") or "").splitlines():
        key, _, value = line.partition(" ")
        if key == inactive_key and value.strip().isdigit():
            inactive = int(value)
            break
    return max(0, int(raw) - inactive)


def available_cpus(root: Path = CGROUP_ROOT, cgroup_text: str | None = None) -> float:
    """Return the CPUs this process may use: the fewest of the machine's, its affinity
    (cpuset) and its cgroup quota. May be fractional (a quota of 1.5 CPUs gives ``1.5``)."""
    cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0)
    cpus = cpus or float(os.cpu_count() or 1)
    quota = cgroup_cpu_limit(root, cgroup_text)
    return min(cpus, quota) if quota else cpus


def memory_limit_mb(root: Path = CGROUP_ROOT, cgroup_text: str | None = None) -> float:
    """Return the memory this process may use in MB: the machine's RAM or the cgroup limit,
    whichever is smaller."""
    total = psutil.virtual_memory().total
    limit = cgroup_memory_limit_bytes(root, cgroup_text)
    return min(total, limit or total) / 2**20


@dataclass
class HostLimits:
    """The host's capacity as seen from inside its container."""

    cpus: float
    memory_limit_mb: float
    cpu_ids: list[int]

    @classmethod
    def detect(cls, root: Path = CGROUP_ROOT) -> HostLimits:
        """Read the live limits of this process (cgroup-aware)."""
        if hasattr(os, "sched_getaffinity"):
            cpu_ids = sorted(os.sched_getaffinity(0))
        else:  # pragma: no cover - macOS has no affinity
            cpu_ids = list(range(os.cpu_count() or 1))
        return cls(available_cpus(root), memory_limit_mb(root), cpu_ids)


class HostSampler:
    """Samples host CPU use and memory for the agent's ``host`` field.

    ``psutil.cpu_percent`` is non-blocking: each call reports use since the previous call, so
    one sampler must be called from one loop at a steady interval. Limits are re-read every
    ``limits_every`` samples because a container's quota can change while it runs, and at once
    when the CPU affinity (the cpuset) changes, which costs one system call a sample to notice.
    """

    def __init__(self, cgroup_root: Path = CGROUP_ROOT, limits_every: int = 60) -> None:
        self.cgroup_root = cgroup_root
        self.limits_every = limits_every
        self.limits = HostLimits.detect(cgroup_root)
        self._in_cgroup = cgroup_memory_limit_bytes(cgroup_root) is not None
        self._count = 0
        psutil.cpu_percent(percpu=True)  # prime: the first call has nothing to compare with

    def refresh(self) -> bool:
        """Re-read the limits if this process's CPU set changed since they were read (a cpuset
        shrunk or grown, ``taskset``); return whether they changed."""
        if not hasattr(os, "sched_getaffinity"):  # pragma: no cover - macOS has no affinity
            return False
        if sorted(os.sched_getaffinity(0)) == self.limits.cpu_ids:
            return False
        before = (self.limits.cpus, self.limits.cpu_ids)
        self.limits = HostLimits.detect(self.cgroup_root)
        return (self.limits.cpus, self.limits.cpu_ids) != before

    def sample(self, worker_budget: int) -> dict:
        """Return the protocol's ``host`` object: cpus, cpu_percent, per_cpu_percent,
        memory_used_mb, memory_limit_mb and the budget's CPU slots in force
        (``worker_budget``, :mod:`agents.budget`)."""
        self._count += 1
        if self._count % self.limits_every == 0:
            self.limits = HostLimits.detect(self.cgroup_root)
        else:
            self.refresh()
        per_cpu = psutil.cpu_percent(percpu=True)
        # Only the CPUs this process may run on say anything about its pipeline.
        mine = [per_cpu[i] for i in self.limits.cpu_ids if i < len(per_cpu)] or per_cpu
        used = cgroup_memory_used_bytes(self.cgroup_root) if self._in_cgroup else None
        if used is None:
            vm = psutil.virtual_memory()
            used = vm.total - vm.available
        return {
            "cpus": float(self.limits.cpus),
            "cpu_percent": round(sum(mine) / len(mine), 2) if mine else 0.0,
            "per_cpu_percent": [float(p) for p in mine],
            "memory_used_mb": round(used / 2**20, 1),
            "memory_limit_mb": round(self.limits.memory_limit_mb, 1),
            "worker_budget": int(worker_budget),
        }
