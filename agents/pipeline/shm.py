"""Move arrays between stage processes through shared memory instead of a pipe.

A process worker's result is pickled with every numpy array, CPU torch tensor, ``bytes`` and
``bytearray`` in it, at any depth and in any object, replaced by a placeholder; the buffers
are copied once into a single file in ``/dev/shm``, so only the skeleton travels through the
worker's pipe. Pickle keeps every container's exact type (named tuples, ``torch.Size``,
``OrderedDict``, dataclasses, tuple against list, dict order).
Creating a fresh file per result costs more than the copy (the kernel allocates and zeroes
every page), so each producing process keeps a small pool of files and reuses them: the
receiver copies the buffers out (a memcpy) and flags the file free again. When the pool is
exhausted a one-off file is used instead; its receiver keeps views of the mapping (no copy)
and unlinks it at once. Results smaller than ``min_bytes`` travel by pickle, where that is
cheaper (``dumps``: a tensor as its bytes, never as a handle on the process that made it).
"""

from __future__ import annotations

import copyreg
import errno
import glob
import io
import itertools
import logging
import mmap
import os
import pickle
import sys
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

log = logging.getLogger("agents.pipeline")

SHM_DIR = "/dev/shm"
DEFAULT_MIN_BYTES = 64 * 1024
_ALIGN = 64
_counter = itertools.count()
# Fault every page in with one call rather than one fault per 4 KiB page as it is touched:
# for a batch of a few MB that is most of the cost of a transfer.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


# Placeholders are named tuples, not dataclasses: a batch may hold dozens of them, and 54
# dataclass placeholders take about 1.8 times as long to pickle and unpickle (98 us against 55).
class _Slot(NamedTuple):
    """Where one buffer of a packet lies in the shared file, and how to rebuild it."""

    kind: str  # "numpy", "torch", "bytes", "bytearray", or "storage" (what _View looks into)
    offset: int
    nbytes: int
    dtype: Any  # str, or a numpy dtype that its string does not rebuild (_numpy_dtype)
    shape: tuple[int, ...]


class _View(NamedTuple):
    """A tensor that is a view of a storage shipped once for all its views (``unbind()``,
    ``split()``): rebuilt as a view again, so the receiver makes one copy, not one per view."""

    storage: _Slot
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int


@dataclass(frozen=True)
class SharedPacket:
    """A picklable handle on a result whose buffers lie in one shared-memory file."""

    path: str
    size: int
    skeleton: tuple[bytes, tuple]  # the result pickled without its buffers, and their slots
    pooled: bool = False


# A pooled file starts with a header: byte 0 is 1 while a result is in flight in it, byte 1
# is 1 once its producer has exited (whoever sees it free last then unlinks it).
_HEADER = 64
_IN_FLIGHT, _ORPHANED = 0, 1
POOL_FILES = 12  # per producing process: enough for its queue and then some
_MAPPING_CACHE = 64  # mappings a receiving process keeps open, most recent first


class _Pool:
    """This process's reusable shared files (reset in a forked child: they are the parent's)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.files: list[tuple[str, int, mmap.mmap]] = []
        self.mapped: dict[str, mmap.mmap] = {}
        self.lock = threading.Lock()  # prefetch threads of one process unpack side by side
        self.warned_full = False


_state = _Pool()


def _local() -> _Pool:
    global _state
    if _state.pid != os.getpid():
        _state = _Pool()
    return _state


class ShmFull(OSError):
    """``/dev/shm`` has no room for a result's file (a container's 64 MiB default)."""


def _create(path: str, size: int) -> mmap.mmap:
    """A new shared file of ``size`` bytes, mapped. Its pages are reserved first: a file on a
    full tmpfs is made without complaint, and writing to it then kills the writer with
    SIGBUS (torch's "bus error ... insufficient shared memory" in Docker). Raises ``ShmFull``
    instead, with nothing left behind. A file system that cannot reserve (no fallocate)
    gets the file as before."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise ShmFull(
                    exc.errno, f"no room for {size / 2**20:.1f} MiB in {SHM_DIR}: {exc.strerror}"
                ) from exc
        return mmap.mmap(fd, size, flags=_MAP_FLAGS)
    except BaseException:
        _unlink(path)
        raise
    finally:
        os.close(fd)


def _warn_full(exc: ShmFull, prefix: str) -> None:
    """Say once per pipeline that results go by pipe because shared memory is full (the
    first of its workers to find it full leaves a marker file, swept with its files)."""
    pool = _local()
    if pool.warned_full:
        return
    pool.warned_full = True
    try:
        os.close(os.open(f"{SHM_DIR}/{prefix}-full", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return  # another worker of this pipeline said it
    except OSError:
        pass
    try:
        stats = os.statvfs(SHM_DIR)
        free, size = (n * stats.f_frsize / 2**20 for n in (stats.f_bavail, stats.f_blocks))
        room = f"{free:.0f} MiB free of {size:.0f} MiB"
    except OSError:
        room = "its size unknown"
    log.warning(
        "%s (%s); results of pid %d and of other workers now go through their pipes when "
        "shared memory is short (slower, but nothing fails). Give the host or container more "
        "(docker run --shm-size=8g, compose shm_size; Kubernetes: an emptyDir of medium Memory "
        "on /dev/shm) or lower prefetch and queue sizes.",
        exc.strerror, room, os.getpid(),
    )  # fmt: skip


def _pooled_file(prefix: str, needed: int) -> tuple[str, int, mmap.mmap] | None:
    pool = _local()
    for entry in pool.files:
        _, size, region = entry
        if region[_IN_FLIGHT] == 0 and needed <= size - _HEADER <= 4 * needed:
            return entry
    if len(pool.files) >= POOL_FILES:
        return None
    size = _HEADER + (needed + 2**20 - 1) // 2**20 * 2**20  # whole MiB: room to grow a bit
    path = f"{SHM_DIR}/{prefix}-{os.getpid()}-p{next(_counter)}"
    entry = (path, size, _create(path, size))
    pool.files.append(entry)
    return entry


def release_pool() -> None:
    """Give up this process's pooled files (it is exiting): unlink those not in flight."""
    pool = _local()
    for path, _, region in pool.files:
        region[_ORPHANED] = 1
        if region[_IN_FLIGHT] == 0:
            _unlink(path)
    pool.files.clear()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def available() -> bool:
    """Say whether POSIX shared memory can be used on this host (Linux: ``/dev/shm``)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def _torch():
    # torch is only looked at when the caller has imported it: the runtime itself stays light.
    return sys.modules.get("torch")


def _is_buffer(obj: Any) -> bool:
    """Whether ``obj`` is shipped as raw bytes: a numpy array of plain values, a plain CPU
    tensor, ``bytes`` or ``bytearray`` (exact types only: a subclass keeps its own pickling)."""
    kind = type(obj)
    if kind is bytes or kind is bytearray:
        return True
    if kind is np.ndarray:
        # Not an array holding Python objects (a structured dtype with an object field too):
        # its bytes are pointers into the sending process.
        return not obj.dtype.hasobject
    torch = _torch()
    return torch is not None and kind is torch.Tensor and _plain_tensor(obj)


def _plain_tensor(tensor: Any) -> bool:
    """A dense CPU tensor outside autograd, whose bytes are all there is to it."""
    return (
        tensor.device.type == "cpu"
        and not tensor.requires_grad
        and tensor.layout == _torch().strided
        # A nested tensor (torch.nested, the default layout) says it is strided, but has no
        # one shape to rebuild it from: it raised "NestedTensorImpl doesn't support sizes".
        and not tensor.is_nested
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
    )


class _Finder(pickle.Pickler):
    """Pickle a result's skeleton: every buffer in it, at any depth and in any object, is
    replaced by its index in ``found`` (one index per object, however often it appears).
    Everything else keeps its exact type (named tuples, ``torch.Size``, ``OrderedDict``,
    dataclasses ...): pickle rebuilds it."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.found: list = []  # holds every buffer, so no id() below is reused meanwhile
        self._index: dict[int, int] = {}
        table = _dispatch_table()
        if table is not None:
            self.dispatch_table = table

    def persistent_id(self, obj: Any) -> int | None:
        if not _is_buffer(obj):
            return None
        index = self._index.get(id(obj))
        if index is None:
            index = self._index[id(obj)] = len(self.found)
            self.found.append(obj)
        return index


class _Loader(pickle.Unpickler):
    """Rebuild a skeleton ``_Finder`` wrote, its buffers from the shared file."""

    def __init__(self, data: bytes, slots: tuple, view: np.ndarray, copy: bool) -> None:
        super().__init__(io.BytesIO(data))
        self._slots, self._view, self._copy, self._memo = slots, view, copy, {}

    def persistent_load(self, pid: Any) -> Any:
        slot = self._slots[pid]
        if slot not in self._memo:
            self._memo[slot] = _rebuild_buffer(slot, self._view, self._copy, self._memo)
        return self._memo[slot]


class _Standalone(pickle.Pickler):
    """The pickler for payloads that travel by pipe: a plain CPU tensor is written as its
    bytes (``dumps``)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        table = _dispatch_table()
        if table is not None:
            self.dispatch_table = table


def dumps(payload: Any) -> bytes:
    """Pickle a payload so that it stands on its own: it can be read after the process that
    wrote it is gone.

    Never with ``multiprocessing``'s ``ForkingPickler``: once torch is imported, that sends a
    tensor as a file descriptor the reader fetches from the writing process when it unpickles,
    and a worker retired by a resize, or killed, has left by then (``ConnectionRefusedError``).
    A plain CPU tensor is written as its bytes (only its own: a slice of a big tensor does
    not carry the rest), cheaper than torch's standard pickling, which writes the whole
    storage of every tensor through ``torch.save``.
    """
    file = io.BytesIO()
    _Standalone(file).dump(payload)
    return file.getvalue()


def _dispatch_table() -> dict | None:
    torch = _torch()
    if torch is None:
        return None
    global _TABLE
    if _TABLE is None:
        table = copyreg.dispatch_table.copy()
        table[torch.Tensor] = _reduce_tensor
        _TABLE = table
    return _TABLE


_TABLE: dict | None = None


def _reduce_tensor(tensor: Any) -> Any:
    if not _plain_tensor(tensor):
        return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    span = _strided_span(tensor)
    if span is not None:
        flat = span.view(_torch().uint8).numpy()
        return _tensor_from_bytes, (
            pickle.PickleBuffer(flat), str(tensor.dtype), tuple(tensor.shape), tensor.stride()
        )  # fmt: skip
    flat = tensor.detach().contiguous().reshape(-1).view(_torch().uint8).numpy()
    return _tensor_from_bytes, (pickle.PickleBuffer(flat), str(tensor.dtype), tuple(tensor.shape))


def _tensor_from_bytes(
    data: bytearray, dtype: str, shape: tuple[int, ...], stride: tuple[int, ...] | None = None
) -> Any:
    """A tensor ``_reduce_tensor`` wrote (it keeps ``data`` as its memory, no copy); with
    ``stride``, laid out over it as the tensor sent was (``_strided_span``)."""
    torch_dtype = _torch_dtype(dtype)
    torch = _torch()
    if len(data) == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=torch_dtype)
    flat = torch.frombuffer(data, dtype=torch.uint8).view(torch_dtype)
    if stride is not None:
        return flat.as_strided(shape, stride)
    return flat.reshape(shape)


def _strided_span(tensor: Any) -> Any:
    """The memory a tensor that is not contiguous lies in, as one contiguous 1-D tensor of
    its dtype, where that memory holds nothing else: a permuted tensor (``permute``,
    ``channels_last``, ``.t()``) or one that repeats its elements (``expand``). Sent with the
    tensor's strides, it comes back laid out as it was sent, as torch's workers send a tensor
    (its storage and strides). Made contiguous instead, a batch of ``channels_last`` images
    arrived as a contiguous one (another layout, other kernels in the model), and an
    expanded tensor arrived as large as its expansion. ``None``: contiguous already, or with
    gaps between its elements (a strided slice: sent contiguous, its own elements only)."""
    if tensor.is_contiguous() or tensor.numel() == 0:
        return None
    span = 1 + sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    if span > tensor.numel():
        return None
    return tensor.detach().as_strided((span,), (1,))


def _nbytes(buf: Any) -> int:
    if isinstance(buf, bytes | bytearray):
        return len(buf)
    if isinstance(buf, np.ndarray):
        return buf.nbytes
    return buf.numel() * buf.element_size()


def pack(obj: Any, prefix: str, min_bytes: int = DEFAULT_MIN_BYTES) -> Any:
    """Return ``obj`` with its buffers moved to shared memory, or ``obj`` itself when small.

    ``prefix`` names the owner of the file (a pipeline), so that ``sweep(prefix)`` can remove
    what no receiver took when the pipeline stops. A buffer that appears twice is shipped
    once and comes back as one object; tensors that are views of one storage are shipped as
    that storage and come back as views of one copy of it.
    """
    file = io.BytesIO()
    finder = _Finder(file)
    finder.dump(obj)
    found = finder.found
    total = sum(_nbytes(b) for b in found)
    if total < min_bytes or not found:
        return obj  # small, or nothing to move (with min_bytes 0: no buffer at all)
    layout: dict[int, _Slot | _View] = {}
    storages: dict[int, tuple[_Slot, Any]] = {}  # data_ptr -> slot, uint8 tensor over it
    offset = 0

    def place(nbytes: int, kind: str, dtype: str, shape: tuple) -> _Slot:
        nonlocal offset
        slot = _Slot(kind, offset, nbytes, dtype, shape)
        # Even an empty buffer gets an offset of its own: the receiver tells buffers apart
        # by their placeholders, and two different empty tensors must stay two objects.
        offset += (max(nbytes, 1) + _ALIGN - 1) // _ALIGN * _ALIGN
        return slot

    shared = _shared_storages(found)
    spans: list[tuple[_Slot, Any]] = []  # the memory of the tensors sent with their strides
    for buf in found:
        if id(buf) in layout:
            continue
        nbytes = _nbytes(buf)
        if isinstance(buf, bytes | bytearray):
            layout[id(buf)] = place(nbytes, type(buf).__name__, "uint8", (nbytes,))
        elif isinstance(buf, np.ndarray):
            layout[id(buf)] = place(nbytes, "numpy", _numpy_dtype(buf.dtype), tuple(buf.shape))
        elif buf.untyped_storage().data_ptr() in shared:
            storage = buf.untyped_storage()
            if storage.data_ptr() not in storages:
                whole = _torch().empty(0, dtype=_torch().uint8).set_(storage)
                storages[storage.data_ptr()] = (
                    place(storage.nbytes(), "storage", "uint8", (storage.nbytes(),)),
                    whole,
                )
            slot = storages[storage.data_ptr()][0]
            layout[id(buf)] = _View(
                slot, str(buf.dtype), tuple(buf.shape), tuple(buf.stride()), buf.storage_offset()
            )
        elif (span := _strided_span(buf)) is not None:
            # Sent as its memory and its strides (_strided_span says why).
            raw = span.view(_torch().uint8)
            slot = place(raw.numel(), "storage", "uint8", (raw.numel(),))
            spans.append((slot, raw))
            layout[id(buf)] = _View(slot, str(buf.dtype), tuple(buf.shape), buf.stride(), 0)
        else:
            layout[id(buf)] = place(nbytes, "torch", str(buf.dtype), tuple(buf.shape))
    try:
        pooled = _pooled_file(prefix, offset)
        if pooled is not None:
            path, size, region = pooled
            base = _HEADER
        else:
            size = max(offset, 1)
            path = f"{SHM_DIR}/{prefix}-{os.getpid()}-{next(_counter)}"
            region = _create(path, size)
            base = 0
    except ShmFull as exc:
        _warn_full(exc, prefix)
        return obj  # by pickle, through the worker's pipe
    try:
        view, target = np.frombuffer(region, dtype=np.uint8)[base:], None
        copies = [(layout[id(b)], b) for b in found]
        copies += list(storages.values()) + spans
        for slot, buf in copies:
            if isinstance(slot, _View):
                continue  # its storage is copied once, below
            target = view[slot.offset : slot.offset + slot.nbytes]
            if isinstance(buf, bytes | bytearray):
                target[:] = np.frombuffer(buf, dtype=np.uint8)
            elif isinstance(buf, np.ndarray):
                target[:] = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
            else:
                target[:] = buf.contiguous().reshape(-1).view(_torch().uint8).numpy()
        del view, target
    finally:
        if pooled is None:
            region.close()
    if pooled is not None:
        region[_IN_FLIGHT] = 1
    slots = tuple(layout[id(b)] for b in found)
    return SharedPacket(path, size, (file.getvalue(), slots), pooled is not None)


def _shared_storages(found: list) -> set[int]:
    """The storages worth shipping whole: those several of the tensors found are views of,
    and that those views mostly cover (a small slice of a big tensor is shipped alone)."""
    torch = _torch()
    if torch is None:
        return set()
    views: dict[int, dict[int, Any]] = {}
    for buf in found:
        if isinstance(buf, torch.Tensor) and buf.numel() > 0:
            views.setdefault(buf.untyped_storage().data_ptr(), {})[id(buf)] = buf
    shared = set()
    for ptr, tensors in views.items():
        if len(tensors) < 2:
            continue
        storage_bytes = next(iter(tensors.values())).untyped_storage().nbytes()
        if 2 * sum(_nbytes(t) for t in tensors.values()) >= storage_bytes:
            shared.add(ptr)
    return shared


def unpack(packet: SharedPacket, release: bool = True) -> Any:
    """Rebuild the result a ``SharedPacket`` stands for.

    With ``release`` (the default) its file is given back at once: a pooled file is flagged
    free for its producer, a one-off file is unlinked (the mapping keeps its pages while
    views of it live). A process worker passes ``False`` and calls ``free()`` once it has
    answered the item: until then the packet can be read again, whole, by another worker if
    this one dies.
    """
    if packet.pooled:
        result = _unpack_pooled(packet)
    else:
        fd = os.open(packet.path, os.O_RDWR)
        try:
            region = mmap.mmap(fd, packet.size, flags=_MAP_FLAGS)
        finally:
            os.close(fd)
        # A one-off file is kept as views (no copy): unlinking it later is safe, the mapping
        # keeps the pages until its last view is gone.
        result = _rebuild(packet.skeleton, np.frombuffer(region, dtype=np.uint8))
    if release:
        free(packet)
    return result


def _unpack_pooled(packet: SharedPacket) -> Any:
    pool = _local()
    with pool.lock:
        region = pool.mapped.pop(packet.path, None)
        if region is None:
            fd = os.open(packet.path, os.O_RDWR)
            try:
                region = mmap.mmap(fd, packet.size, flags=_MAP_FLAGS)
            finally:
                os.close(fd)
        pool.mapped[packet.path] = region  # most recently used last
        while len(pool.mapped) > _MAPPING_CACHE:
            del pool.mapped[next(iter(pool.mapped))]
        # The files of producers that have left (a worker retired by a resize, or replaced):
        # unlinked, but a mapping keeps their pages, and nothing would use them again. Left
        # to the cache's bound, a persistent loader resized live kept 32 to 48 MiB of them
        # over two epochs of 8 MB batches (up to 64 files: 3 GB of 50 MB batches).
        for path in [p for p, r in pool.mapped.items() if r[_ORPHANED] and not r[_IN_FLIGHT]]:
            if path != packet.path:
                del pool.mapped[path]
    view = np.frombuffer(region, dtype=np.uint8)[_HEADER:]
    result = _rebuild(packet.skeleton, view, copy=True)
    del view
    return result


def free(packet: SharedPacket) -> None:
    """Give a read packet's file back: free a pooled one for its producer, unlink a one-off."""
    if not packet.pooled:
        _unlink(packet.path)
        return
    pool = _local()
    with pool.lock:
        region = pool.mapped.get(packet.path)
    if region is None:
        try:
            fd = os.open(packet.path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            region = mmap.mmap(fd, _HEADER)
        finally:
            os.close(fd)
    region[_IN_FLIGHT] = 0  # the producer may reuse the file now
    if region[_ORPHANED]:
        _unlink(packet.path)
        with pool.lock:
            pool.mapped.pop(packet.path, None)


def _rebuild(skeleton: tuple[bytes, tuple], view: np.ndarray, copy: bool = False) -> Any:
    data, slots = skeleton
    return _Loader(data, slots, view, copy).load()


def _rebuild_buffer(slot: _Slot | _View, view: np.ndarray, copy: bool, memo: dict) -> Any:
    if isinstance(slot, _View):
        if slot.storage not in memo:
            memo[slot.storage] = _rebuild_buffer(slot.storage, view, copy, memo)
        storage = memo[slot.storage]
        dtype = _torch_dtype(slot.dtype)
        return (
            _torch()
            .empty(0, dtype=dtype)
            .set_(storage.untyped_storage(), slot.storage_offset, slot.shape, slot.stride)
        )
    raw = view[slot.offset : slot.offset + slot.nbytes]
    if slot.kind == "bytes":
        return raw.tobytes()
    if slot.kind == "bytearray":
        return bytearray(raw)
    if slot.kind == "numpy":
        array = raw.view(np.dtype(slot.dtype)).reshape(slot.shape)
        return array.copy() if copy else array
    dtype = _torch_dtype(slot.dtype)
    torch = _torch()
    if slot.nbytes == 0:  # torch.frombuffer refuses an empty buffer
        return torch.empty(slot.shape, dtype=dtype)
    if copy:
        tensor = torch.empty(slot.shape, dtype=dtype)
        tensor.view(-1).view(torch.uint8).numpy()[:] = raw
        return tensor
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(slot.shape)


def _numpy_dtype(dtype: np.dtype) -> str | np.dtype:
    """What a slot names a numpy array's dtype by: its string, where that rebuilds it, else
    the dtype itself (a structured one: its string, ``|V8``, dropped the field names, and a
    record array came back as raw bytes, ``arr["label"]`` raising)."""
    name = dtype.str
    return name if np.dtype(name) == dtype else dtype


def _torch_dtype(name: str) -> Any:
    torch = _torch()
    if torch is None:  # the receiver never imported torch; it needs it for a tensor
        import torch
    return getattr(torch, name.removeprefix("torch."))


def discard(packet: SharedPacket) -> None:
    """Drop a packet nobody will read (the pipeline is stopping)."""
    _unlink(packet.path)


def forget(prefix: str) -> None:
    """Drop this process's mappings of a stopped pipeline's files. The receiver keeps up to
    ``_MAPPING_CACHE`` of them open for reuse; once their files are unlinked, a mapping still
    holds the file's pages: a training script whose loader starts a pipeline per epoch held
    384 MiB of deleted files after 4 epochs of 16 MB batches, and kept them after ``close()``
    (64 mappings of 50 MB batches would hold 3 GB). Dropped, not closed: a view of one may be
    alive in another thread's unpack, and the last reference closes it."""
    pool = _local()
    with pool.lock:
        for path in [path for path in pool.mapped if path.startswith(f"{SHM_DIR}/{prefix}-")]:
            del pool.mapped[path]


def sweep(prefix: str) -> int:
    """Unlink every shared file a pipeline left behind; return how many there were."""
    removed = 0
    for path in glob.glob(f"{SHM_DIR}/{prefix}-*"):
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed
