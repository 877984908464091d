"""The `spatialc` command: build, verify, evaluate, lower and run GEMMs; show saved programs; check a GPU."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import numpy as np

from . import api
from .errors import SpatialError
from .ir.nodes import Buffer, Fifo, Interm, SpatialProgram
from .ir.printer import program_text
from .ir.serde import SerdeError, to_json
from .target import TARGETS, target

EPILOG = (
    "exit status: 0 done, 1 a result differs from the reference, 2 bad input (one line on stderr says what),"
    " 3 an internal error (a bug: re-run with --traceback and report it)"
)
EXIT_INTERNAL = 3
# The largest document `show` and `verify` read: a program of verify's MAX_ITEMS (2^24) items lists each in its
# placement, about 10 bytes apiece, and the rest of a program is small beside that.
MAX_DOCUMENT_BYTES = 512 << 20
EXIT_PIPE = 128 + 13  # a shell's status for a writer ended by SIGPIPE: how `yes | head` ends, so how we end


class UsageError(Exception):
    """A command line that cannot be run as written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _ints(n: int, what: str):
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            values = ()
        if len(values) != n:
            raise argparse.ArgumentTypeError(f"{what} must be {n} comma-separated whole numbers, not {text!r}")
        return values

    return parse


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0, not {text!r}")
    return value


def _scalar(text: str) -> tuple[str, float]:
    op, _, value = text.partition(",")
    try:
        return op, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--scalar takes OP,VALUE (e.g. mul,0.5), not {text!r}") from None


def _requant(text: str) -> tuple[float, int]:
    scale, _, zp = text.partition(",")
    try:
        return float(scale), int(zp or 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--requant takes SCALE[,ZERO_POINT] (e.g. 0.01,5), not {text!r}") from None


def epilogue_of(args: argparse.Namespace) -> list:
    """The epilogue the flags ask for, in the fixed order bias → relu → scalars → requant."""
    from . import frontend

    stages: list = [frontend.bias()] if args.bias else []
    stages += [frontend.relu()] if args.relu else []
    stages += [frontend.scalar(op, value) for op, value in args.scalar]
    stages += [frontend.requant(*args.requant)] if args.requant else []
    return stages


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spatialc", description=__doc__, epilog=EPILOG)
    parser.add_argument(
        "--traceback", action="store_true", help="on an internal error, show the Python traceback (for a bug report)"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("gemm", help="build, verify and check C = A @ B; optionally emit CUDA and run it")
    g.add_argument("m", type=int)
    g.add_argument("n", type=int)
    g.add_argument("k", type=int)
    g.add_argument("--precision", default="int8", choices=["int8", "fp16", "bf16"])
    g.add_argument("--target", default="sm_90", help=f"one of {', '.join(TARGETS)}")
    g.add_argument("--block", type=_ints(3, "--block"), metavar="OSH,OSW,IBW", help="force the block shape")
    g.add_argument("--sub-blocks", type=_ints(2, "--sub-blocks"), metavar="SH,SW", help="force sub-blocks per item")
    g.add_argument("--depth", type=int, help="force the operand ring depth (pages)")
    g.add_argument("--sites", type=int, help="number of sites (default: what the target keeps resident)")
    g.add_argument("--placement", choices=["contiguous", "round_robin"], default="contiguous")
    g.add_argument("--bias", action="store_true", help="epilogue: add a bias vector (one value per column)")
    g.add_argument("--relu", action="store_true", help="epilogue: max(x, 0), after the bias")
    g.add_argument(
        "--scalar",
        action="append",
        type=_scalar,
        default=[],
        metavar="OP,VALUE",
        help="epilogue: x OP VALUE (add, mul, max, min), after relu; may repeat",
    )
    g.add_argument("--requant", type=_requant, metavar="SCALE[,ZP]", help="epilogue: requantise to int8, last")
    g.add_argument("--seed", type=_count, default=0, help="seed of the random inputs (a whole number ≥ 0)")
    g.add_argument("--json", type=Path, metavar="FILE", help="save the verified program as JSON")
    g.add_argument("--show", action="store_true", help="print the program's choreography (first two sites)")
    g.add_argument("--emit", type=Path, metavar="DIR", help="lower to CUDA and write program.cu, bench.cu, budget")
    g.add_argument("--run", action="store_true", help="run the CUDA kernel: on the GPU if there is one, else emulated")
    g.add_argument("--mode", choices=["late", "early"], default="late", help="copy landing mode of the emulation")
    g.add_argument(
        "--pictures",
        type=Path,
        metavar="DIR",
        help="write placement.svg (items on sites) and timeline.svg (site 0's engines and rings)",
    )
    s = sub.add_parser("show", help="print a saved program")
    s.add_argument("file", type=Path)
    s.add_argument("--sites", type=_count, default=2, help="how many sites' programs to list")
    v = sub.add_parser("verify", help="verify a saved (possibly hand-written) program")
    v.add_argument("file", type=Path)
    v.add_argument("--pictures", type=Path, metavar="DIR", help="on a deadlock, write its wait-for graph here")
    # Listed for --help only: main() hands everything after `gpucheck` to the script's own parser.
    sub.add_parser(
        "gpucheck", help="run the GPU check script (spatialc gpucheck --help for its options)", add_help=False
    )
    return parser


def random_inputs(p: SpatialProgram, seed: int) -> dict[str, np.ndarray]:
    """Inputs for a GEMM: int8 over its whole range, fp16/bf16 standard normal rounded to the operand type (float32
    arrays: they were chosen at random, so they are not rounded again, with a warning, on the way in); a bias of n
    values (int32 within ±2^15 for int8 programs)."""
    from .inputs import operand_values

    rng = np.random.default_rng(seed)
    out = {}
    integer = p.precision.value == "int8"
    for t in p.tensors:
        if t.role.value == "input":
            out[t.name] = (
                rng.integers(-128, 128, size=t.elems, dtype=np.int8)
                if integer
                else operand_values(t.name, rng.standard_normal(t.elems), t.dtype).astype(np.float32)
            )
        elif t.role.value == "parameter":
            n = t.elems[1]
            out[t.name] = rng.integers(-(2**15), 2**15, size=n).astype(np.int32) if integer else rng.standard_normal(n)
    return out


def float_bound(p: SpatialProgram, inputs: dict[str, np.ndarray], ref: np.ndarray, ulps: float) -> np.ndarray:
    """Per-element error bound: `ulps` float32 units of |A|@|B| (scaled by any scalar multiplies), plus one unit of
    the result itself for the epilogue's own float32 rounding."""
    from .ir.ops import Scalar
    from .reference import epilogue_ops, rounded_operands

    a, b = rounded_operands(p, inputs)
    scale = np.prod([abs(op.value) for op in epilogue_ops(p) if isinstance(op, Scalar) and op.op == "mul"] or [1.0])
    eps = float(np.finfo(np.float32).eps)
    size = np.abs(ref.astype(np.float64))
    return ulps * eps * max(scale, 1.0) * (np.abs(a) @ np.abs(b)) + 2 * eps * size + np.finfo(np.float32).tiny


def check(p: SpatialProgram, c: np.ndarray, inputs: dict[str, np.ndarray], fp32_sum: bool = False) -> tuple[bool, str]:
    """Compare C with the numpy reference: exactly for int8 programs; for fp16/bf16 within 4 float32 ulps of |A|@|B|
    (a float64 sum rounded once), or — for kernels that sum in float32 (`fp32_sum`) — within K + 4 of them, the
    classical bound of a K-term float32 sum."""
    from .reference import reference

    ref = reference(p, inputs)
    if p.precision.value == "int8":
        bad = int(np.count_nonzero(c != ref))
        return bad == 0, "exact" if bad == 0 else f"{bad} of {c.size} elements differ"
    k = p.tensor_named("A").elems[1]
    ulps = k + 4 if fp32_sum else 4
    err = np.abs(c.astype(np.float64) - ref.astype(np.float64))
    ok = bool(np.all(err <= float_bound(p, inputs, ref, ulps)))
    return ok, f"max |error| {err.max():.3g} (bound: {ulps} float32 ulps of |A|@|B|)"


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def _rings(p: SpatialProgram) -> str:
    def one(b: Buffer) -> str | None:
        if isinstance(b.kind, Fifo | Interm):
            return f"{b.name} {b.kind.depth_pages}x{b.kind.page_tiles} tiles"
        return None

    return ", ".join(r for r in (one(b) for b in p.buffers) if r)


def report(p: SpatialProgram) -> list[str]:
    """The plan, placement and rings of a built program, a line each."""
    from .passes.tile import sites_per_unit, smem_bytes

    t = target(p.target)
    plan = p.plan
    assert plan is not None and p.placement is not None
    b = plan.block
    h, w = plan.item_tiles
    counts = [len(items) for _, items in p.placement.items_of_site]
    smem = smem_bytes(t, plan, p.precision)
    per_sm = sites_per_unit(t, plan, p.precision)
    return [
        f"  plan      block {b.osh}x{b.osw}x{b.ibw}, sub-blocks {plan.sub_blocks[0]}x{plan.sub_blocks[1]}"
        f" (items of {h * 16}x{w * 16} outputs), grid {plan.grid[0]}x{plan.grid[1]} items,"
        f" {plan.k_steps} K steps, ring depth {plan.depth}",
        f"  sites     {len(counts)} ({p.placement.kind}), items per site {min(counts)}..{max(counts)}",
        f"  rings     {_rings(p)}; shared memory {_kib(smem)} per site, {per_sm} sites per SM",
    ]


def cmd_gemm(args: argparse.Namespace) -> int:
    from .interp.evaluate import check_memory

    t0 = time.perf_counter()
    prog = api.gemm(args.m, args.n, args.k, args.precision, epilogue=epilogue_of(args))
    p = api.build(
        prog,
        args.target,
        block=args.block,
        sub_blocks=args.sub_blocks,
        depth=args.depth,
        sites=args.sites,
        placement=args.placement,
    )
    t_build = time.perf_counter() - t0
    tgt = target(p.target)
    print(
        f"spatialc gemm {args.m}x{args.n}x{args.k} {args.precision} on {tgt.name} ({tgt.board})"
        + (f", epilogue {prog.name.split('_', 3)[3].replace('_', ' → ')}" if prog.name.count("_") > 2 else "")
    )
    print("\n".join(report(p)))
    if args.json:
        args.json.write_text(to_json(p, indent=1))
        print(f"  saved     {args.json}")
    check_memory(p)  # refused now, before the random inputs take gigabytes of their own
    inputs = random_inputs(p, args.seed)
    t0 = time.perf_counter()
    if args.pictures:
        c, trace = api.evaluate(p, inputs, trace=True)
    else:
        c = api.evaluate(p, inputs)
    t_eval = time.perf_counter() - t0
    if args.pictures:
        _pictures(p, trace, args.pictures)
    ok, how = check(p, c, inputs)
    print(f"  check     interpreter vs numpy reference: {'OK' if ok else 'MISMATCH'}, {how}")
    times = [f"build {t_build * 1e3:.0f} ms", f"evaluate {t_eval * 1e3:.0f} ms"]
    if args.show:
        print(program_text(p, sites=2), end="")
    status = 0 if ok else 1
    if args.emit or args.run:
        status = max(status, _lower_and_run(p, args, inputs, c, times))
    print(f"  time      {', '.join(times)}")
    return status


def _lower_and_run(p: SpatialProgram, args: argparse.Namespace, inputs: dict, c: np.ndarray, times: list[str]) -> int:
    t0 = time.perf_counter()
    art = api.lower(p)
    times.append(f"lower {(time.perf_counter() - t0) * 1e3:.0f} ms")
    bud = art.budget
    print(
        f"  budget    rings {_kib(bud.smem_bytes)} ({'dynamic' if bud.rings_dynamic else 'static'}),"
        f" dynamic block {_kib(bud.dyn_bytes)}{' (opt-in)' if bud.dynamic_opt_in else ''},"
        f" ~{bud.regs_est} registers/thread, {bud.threads} threads, {bud.blocks_per_sm} blocks/SM"
    )
    print(
        f"  census    {sum(art.census.program.values())} ops, printed kernel "
        f"{'agrees' if art.census.agrees else 'DISAGREES'}"
    )
    if args.emit:
        from .lower.cuda.host import write_artifact

        write_artifact(art, args.emit)
        print(f"  emitted   {args.emit}/program.cu, bench.cu, budget.json, census.json")
    if not args.run:
        return 0
    t0 = time.perf_counter()
    where, out = _run_somewhere(art, inputs, args.mode)
    times.append(f"run {(time.perf_counter() - t0) * 1e3:.0f} ms")
    if p.precision.value == "int8":
        same, how = bool(np.array_equal(out, c)), "the reference interpreter, exactly"
    else:
        same, how = check(p, out, inputs, fp32_sum=True)
        how = f"the numpy reference within the float32-sum bound: {how}"
    print(f"  run       {where}: C {'equals' if same else 'DIFFERS FROM'} {how}")
    return 0 if same else 1


def _run_somewhere(art, inputs: dict, mode: str) -> tuple[str, np.ndarray]:
    """Run on the GPU when CuPy finds one, else through the host emulation; say which (and why not the GPU)."""
    from .runtime.launch import GpuUnavailable, cupy_device

    try:
        dev = cupy_device()
    except GpuUnavailable as e:
        return f"under the host emulation ({mode} copies; {e})", api.emulate(art, inputs, mode=mode)
    cp = dev.cp
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    params = {k: v for k, v in inputs.items() if k not in ("A", "B")}
    return f"on the GPU ({name})", np.asarray(api.run(art, inputs["A"], inputs["B"], **params))


def _pictures(p: SpatialProgram, trace, folder: Path) -> None:
    from .viz import placement_svg, timeline_svg

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "placement.svg").write_text(placement_svg(p))
    (folder / "timeline.svg").write_text(timeline_svg(trace, 0, max_ticks=400))
    print(f"  pictures  {folder}/placement.svg, {folder}/timeline.svg (site 0, first 400 ticks)")


def _read_program(path: Path) -> SpatialProgram:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)  # never all of /dev/zero or a runaway file
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise UsageError(f"{path} is over {MAX_DOCUMENT_BYTES >> 20} MiB, more than any spatialc program takes")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a text file, so not a spatialc program") from None
    return api.from_json(text)


def cmd_show(args: argparse.Namespace) -> int:
    print(program_text(_read_program(args.file), sites=args.sites), end="")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify a saved program; a deadlock's wait-for graph goes to --pictures."""
    from .errors import DeadlockError
    from .passes.verify import verify

    p = _read_program(args.file)
    try:
        verify(p)
    except DeadlockError as e:
        if args.pictures:
            from .viz import deadlock_svg

            args.pictures.mkdir(parents=True, exist_ok=True)
            (args.pictures / "deadlock.svg").write_text(deadlock_svg(p, e.blocked))
            raise UsageError(f"{e} (wait-for graph: {args.pictures}/deadlock.svg)") from None
        raise
    print(f"{p.name}: verified (well-formed, balanced, in bounds, placement exact, deadlock-free)")
    return 0


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
    except (UsageError, SpatialError, SerdeError) as e:
        return _fail(str(e))
    except OSError as e:  # an output path that is a file, a folder that cannot be made, a full disk
        return _fail(f"{e.filename or 'a file'}: {e.strerror or e}")
    except MemoryError:
        return _fail("out of memory: this problem is too large for this machine's memory")
    except Exception as e:
        if show_traceback:
            raise
        return _internal_error(e)


def _leading_options(argv: list[str]) -> list[str]:
    """The options before the subcommand: the global ones (--traceback)."""
    return list(itertools.takewhile(lambda a: a.startswith("-"), argv))


def _dispatch(argv: list[str]) -> int:
    rest = argv[len(_leading_options(argv)) :]
    if rest and rest[0] == "gpucheck":
        from . import gpucheck

        return gpucheck.main(rest[1:])
    args = make_parser().parse_args(argv)
    return {"gemm": cmd_gemm, "show": cmd_show, "verify": cmd_verify}[args.command](args)


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


def _fail(message: str) -> int:
    text = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    print(text if text.startswith("spatialc") else f"spatialc: error: {text}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
