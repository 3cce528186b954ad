"""Opening a data file on disk without ever blocking on it, and telling a file that changed
under the reader.

``open()`` of a named pipe (FIFO) waits until something opens its other end: for ever, in
a reader that expected a file (measured: a ``day_0.tsv`` replaced by a FIFO after it was
indexed held the read stage with no end). ``open_regular`` opens with ``O_NONBLOCK``, which
returns at once on a FIFO, and refuses whatever is not a regular file, naming it and saying
what to do. ``version`` is what tells a file that changed (its size and modification time,
as the index's signature has them); a reader compares it with the one indexed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
}


def unreadable(path: str, exc: OSError) -> PermissionError:
    """The error for a local file this process may not read, saying what to do."""
    return PermissionError(
        f"{path}: this process (user id {os.geteuid()}) may not read it "
        f"({exc.strerror or exc}): make it readable (chmod a+r), or move it out of the folder"
    )


def not_a_file(path: str, what: str) -> OSError:
    """The error for a data file's name that holds no regular file, saying what to do."""
    return OSError(
        f"{path} is {what}, not a file: the reader seeks in its data files; put the data in a "
        "regular file (or a link to one), or move it out of the folder"
    )


def odd_entry(path: Path) -> str | None:
    """What a folder's entry that is neither a regular file nor a folder is (a named pipe, a
    socket, a device, a link that leads nowhere or in a loop), or ``None`` for a file or a
    folder."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:  # a link that leads nowhere (ENOENT) or in a loop (ELOOP)
        if path.is_symlink():
            return f"a link that leads nowhere ({os.readlink(path)}: {exc.strerror})"
        return None  # gone since it was listed: nothing to refuse
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def version(st: os.stat_result) -> str:
    """What tells a local file that changed: its size and modification time."""
    return f"{st.st_size}:{st.st_mtime_ns}"


def open_regular(path: str, expected: str = "") -> BinaryIO:
    """``path`` opened for reading in binary, never blocking on what is not a regular file
    (refused, naming it); ``expected``: the ``version`` it had when it was indexed (a
    ``ValueError`` if it changed since)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no such file any more (removed or renamed after the folder was listed): "
            "start the pipeline again to list the folder afresh"
        ) from None
    except PermissionError as exc:
        raise unreadable(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_a_file(path, _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file"))
        if expected and version(st) != expected:
            raise changed(path, expected, version(st))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def changed(path: str, indexed: str, now: str) -> ValueError:
    """The error for a file whose ``version`` is no longer the one indexed."""
    return ValueError(
        f"{path} changed after it was indexed (size:mtime {indexed}, now {now}): it was "
        "written again, or is still being written; start the pipeline again once it is "
        "complete, to index it afresh (a writer should write elsewhere and rename the file "
        "into the folder)"
    )
