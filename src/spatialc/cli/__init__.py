"""The `spatialc` command's entry point: `main` reads the command line (`parser.py`, `options.py`), runs the command
(`commands.py`) and turns what goes wrong into one line and an exit status: 2 for bad input, 3 for a bug in spatialc
(`EPILOG`)."""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path

from ..errors import SpatialError, clipped
from .parser import EPILOG as EPILOG  # (named here as before)
from .parser import UsageError, make_parser

EXIT_INTERNAL = 3
EXIT_PIPE = 128 + 13  # a shell's status for a writer ended by SIGPIPE: how `yes | head` ends, so how we end


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 for a failed check, 2 for bad input, 3 for a bug in spatialc)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    show_traceback = "--traceback" in _leading_options(argv)
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # here, so that a reader that went away is met inside the try, not at exit
        return status
    except BrokenPipeError:
        return _closed_stdout()
    except (UsageError, SpatialError) as e:
        return _fail(str(e))
    except (FileExistsError, NotADirectoryError) as e:  # an output folder (--emit, --pictures, --json's) is a file
        return _fail(_in_the_way(Path(str(e.filename))) if e.filename else str(e))
    except OSError as e:  # a folder that cannot be made, a full disk
        return _fail(f"{e.filename or 'a file'}: {e.strerror or e}")
    except MemoryError:
        return _fail("out of memory: this problem is too large for this machine's memory")
    except Exception as e:
        if show_traceback:
            raise
        return _internal_error(e)


def _in_the_way(path: Path) -> str:
    """What stops a folder being made at `path`: the nearest of it and its parents that exists and is a file."""
    blocker = next((at for at in (path, *path.parents) if at.exists() and not at.is_dir()), path)
    return f"{blocker} is a file, not a folder"


def _leading_options(argv: list[str]) -> list[str]:
    """The options before the subcommand: the global ones (--traceback)."""
    return list(itertools.takewhile(lambda a: a.startswith("-"), argv))


NEGATIVE_LIST = re.compile(r"-\d[\d.eE+-]*(,[-+]?[\d.eE+-]*)+")  # `-1,3`: a list whose first value is negative


def _negative_lists_attached(argv: list[str]) -> list[str]:
    """`--requant -1,3` as `--requant=-1,3`: argparse takes a value starting with '-' for an option of its own
    unless it is one plain negative number, and says only "expected one argument"; attached, the value reaches the
    option's own check, which says what is wrong with it."""
    out: list[str] = []
    for tok in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and NEGATIVE_LIST.fullmatch(tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def _dispatch(argv: list[str]) -> int:
    from . import commands

    rest = argv[len(_leading_options(argv)) :]
    if rest and rest[0] == "gpucheck":
        from .. import gpucheck

        return gpucheck.main(rest[1:])
    args = make_parser().parse_args(_negative_lists_attached(argv))
    if getattr(args, "mode", None) is not None and getattr(args, "run", None) is False:  # a program command's
        raise UsageError(f"spatialc {args.command}: --mode says how the emulation runs the kernel; it goes with --run")
    timeline = [o for o in ("pictures_site", "pictures_window") if getattr(args, o, None) is not None]
    if timeline and not args.pictures:
        option = "--" + timeline[0].replace("_", "-")
        raise UsageError(f"spatialc {args.command}: {option} says what timeline.svg draws; it goes with --pictures DIR")
    return getattr(commands, f"cmd_{args.command.replace('-', '_')}")(args)


def _closed_stdout() -> int:
    """End quietly when stdout's reader has gone (`spatialc show p.json | head`), as Python's documentation says:
    point stdout at devnull, so that flushing it again at exit cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # a stdout that is no file (a test's capture)
        pass
    return EXIT_PIPE


def _internal_error(e: Exception) -> int:
    """A bug in spatialc, not bad input: one line, exit status 3 (never 1, which means a result differs)."""
    message = " ".join(str(e).split())[:300] or "(no message)"
    print(
        f"spatialc: internal error: {type(e).__name__}: {message} (re-run with --traceback to see where)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


MAX_ERROR_LINE = 2000  # far longer than any message spatialc writes, far shorter than the data one could quote


def _fail(message: str) -> int:
    text = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    text = clipped(text, MAX_ERROR_LINE)  # a backstop: each message already cuts what it quotes short
    # A message that names its own command (`spatialc gpucheck: …`) keeps it; any other gets the error prefix, even
    # one that starts with the word (`spatialc program version 99; …`).
    named = re.match(r"spatialc(?: [\w-]+)?: ", text)
    print(text if named else f"spatialc: error: {text}", file=sys.stderr)
    return 2
