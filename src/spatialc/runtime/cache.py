"""Where spatialc keeps what it builds between runs: one root for every cache, `$SPATIALC_CACHE`, else
`$XDG_CACHE_HOME/spatialc`, else `~/.cache/spatialc`; a folder per kind under it (`cubin`: nvcc's cubins,
`emu`: the host emulation's binaries)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def cache_root() -> Path:
    """The folder every spatialc cache lives under."""
    given = os.environ.get("SPATIALC_CACHE")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spatialc"


def cache_dir(kind: str, *, create: bool = False) -> Path:
    """The cache folder of one `kind` (`cubin`, `emu`), made first where `create`."""
    path = cache_root() / kind
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def write_whole(path: Path, data: bytes) -> None:
    """Replace `path` with `data` whole: written aside, then renamed over it (a reader never sees half a file). The
    file aside is made new under a name no one can guess (O_EXCL): a cache folder may be shared, and a link planted
    at a predictable name would have had the write land wherever it points."""
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
