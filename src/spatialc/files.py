"""Reading and writing files that someone else may have put, or may put, where spatialc reads and writes: a saved
program, a prepared folder's manifest, a cache's entries, an output folder's files. A read never waits on a FIFO and
never takes more than a bound; a write never follows a link planted where it goes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_whole(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` (text as UTF-8) whole: written aside, then renamed over it (a reader never sees half
    a file; a link at `path` is replaced, not followed). The file aside is made new under a name no one can guess
    (O_EXCL): a folder may be shared, and a link planted at a predictable name would have had the write land wherever
    it points."""
    data = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # (mkstemp's 0600 would hide a shared cache)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_at_most(path: Path, limit: int) -> bytes | None:
    """The bytes of `path`, or None where it holds more than `limit`: never more than `limit` + 1 bytes read (a link
    to /dev/zero ends), and no wait on a FIFO that no one writes (opened without blocking, it reads as empty). A file
    another may have put (a saved program, a prepared folder's manifest, a cache entry) is read so. OSError as
    `open` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        os.set_blocking(fd, True)  # a pipe with a writer is read to its end
        data = f.read(limit + 1)
    return None if len(data) > limit else data
