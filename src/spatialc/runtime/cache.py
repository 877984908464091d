"""Where spatialc keeps what it builds between runs: one root for every cache, `$SPATIALC_CACHE`, else
`$XDG_CACHE_HOME/spatialc`, else `~/.cache/spatialc`; a folder per kind under it (`cubin`: nvcc's cubins,
`emu`: the host emulation's binaries)."""

from __future__ import annotations

import os
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
