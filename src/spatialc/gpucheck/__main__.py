"""`python -m spatialc.gpucheck OUTDIR …`: the same as `spatialc gpucheck OUTDIR …`."""

import os
import sys

from . import main

if __name__ == "__main__":  # not when a build process started afresh imports this module as its parent's main
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # `python -m spatialc.gpucheck OUTDIR --dry-run | head`: end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None
