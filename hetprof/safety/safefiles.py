"""Opening a file someone else wrote: only a regular file, of a bounded size, without blocking.

A path may name a FIFO (opening it waits for a writer forever), a character device such as
/dev/zero (reading never ends) or a symlink to either; `open_regular` refuses those by what the
opened descriptor is, so a swap between a check and the open changes nothing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO


class NotReadable(ValueError):
    """The path cannot be read as a regular file; the message says why (for 'FILE: <message>')."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def open_regular(path: str | Path) -> BinaryIO:
    """The file open for binary reading; raises NotReadable ('no such file', 'not a regular file (a FIFO)')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting
    except FileNotFoundError:
        raise NotReadable("no such file") from None
    except OSError as exc:
        raise NotReadable(f"cannot be read ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotReadable(f"not a regular file ({_kind(mode)})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The whole of a regular file of at most `limit` bytes; raises NotReadable past it."""
    with open_regular(path) as f:
        if os.fstat(f.fileno()).st_size > limit:  # refused unread (a sparse file of GBs costs nothing)
            raise NotReadable(f"larger than {limit:,} bytes")
        chunks, size = [], 0
        while size <= limit and (chunk := f.read(min(READ_CHUNK, limit + 1 - size))):
            chunks.append(chunk)  # in chunks: read(limit) would allocate all of `limit` up front
            size += len(chunk)
    if size > limit:
        raise NotReadable(f"larger than {limit:,} bytes")
    return b"".join(chunks)


READ_CHUNK = 1 << 20
