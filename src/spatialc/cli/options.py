"""The options the `spatialc` commands share — precision and target, the plan, placement, the epilogue, what is
checked, run and written — and the parsers of their values (`1,2,4`, `START:END`, `OP,VALUE`, …). `parser.py`
builds each command from them."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..arguments import DEFAULT_PRECISION
from ..ir.ops import ACTIVATIONS
from ..target import TARGETS


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


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 0, not {text!r}")
    return value


def _window(text: str) -> tuple[int, int]:
    start, colon, end = text.partition(":")
    try:
        window = int(start), int(end)
    except ValueError:
        window = (-1, -1)
    if not colon or not 0 <= window[0] < window[1]:
        raise argparse.ArgumentTypeError(f"expected START:END, whole numbers, START < END (e.g. 0:400), not {text!r}")
    return window


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


def sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes whole numbers separated by commas, not {text!r}") from None
    wide = next((v for v in sizes if not -(2**31) <= v < 2**31), None)  # the kernel reads the counts as int32
    if wide is not None:
        raise argparse.ArgumentTypeError(f"a row count of {wide} is past what an int32 holds")
    return sizes


def _scale_layouts(text: str) -> tuple[str, str] | str:
    """--scales A,B: two layout names (checked by the frontend), or mx (OCP MX's e8m0 scales per 32 of K)."""
    if text.strip().lower() == "mx":
        return "mx"
    parts = tuple(x.strip() for x in text.split(","))
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"--scales takes A's and B's layouts, e.g. 1x128,128x128, not {text!r}")
    return parts  # type: ignore[return-value]


def page_options(g: argparse.ArgumentParser, out_help: str, block_help: str, *, floats_only: bool = False) -> None:
    """The options of a program without a tile matmul of its own plan (elementwise, the row programs, attention):
    precision, target, a block of ROWS x COLS tiles, placement, and what is checked, run and written."""
    _precision_options(g, "bf16", out_help, floats_only=floats_only)
    g.add_argument("--block", type=_ints(2, "--block"), metavar="ROWS,COLS", help=block_help)
    _placement_options(g, matmul=False)
    g.set_defaults(sub_blocks=None)
    _output_options(g)


def program_options(g: argparse.ArgumentParser, *, split: bool) -> None:
    """The options `gemm` and `grouped-gemm` share: precision, target, plan, placement, epilogue, run, outputs."""
    _precision_options(
        g,
        DEFAULT_PRECISION,
        "C's element type: int32 or int64 for int8 programs, float32, fp16 or bf16 for"
        " float ones (default: the accumulator's — int64 where an int8 epilogue or a long K needs it —"
        " or int8 after --requant)",
    )
    g.add_argument(
        "--block",
        type=_ints(3, "--block"),
        metavar="OSH,OSW,IBW",
        help="force the accumulator block: OSH x OSW output tiles, IBW K-tiles a step (default: the cost model's)",
    )
    g.add_argument(
        "--sub-blocks",
        type=_ints(2, "--sub-blocks"),
        metavar="SH,SW",
        help="force SH x SW blocks per item (default: the cost model's)",
    )
    _placement_options(g)
    if split:
        g.add_argument(
            "--split-k",
            type=int,
            metavar="S",
            help="reduce each item's K on S sites whose partial sums meet in a workspace (general form); default:"
            " the planner splits a GEMM whose items fill at most half the machine while K is long, 1 never splits",
        )
        g.add_argument(
            "--multicast",
            type=_ints(2, "--multicast"),
            metavar="GY,GX",
            help="share operand pages over groups of GY x GX sites: one site of a group row reads each A page and"
            " multicasts it along the row, one of a group column each B page (default: no groups)",
        )
    g.add_argument(  # a block-scaled 8-bit float GEMM (spatialc/blockscaled.py names the layouts), grouped or not
        "--scales",
        type=_scale_layouts,
        metavar="A,B",
        help="e4m3 / e5m2: block-scaled, A's and B's scale layouts (1x128,128x128 is DeepGEMM's; row, col, tensor)"
        " — C = Σ over each 128 of K of (A_g @ B_g) · scale_a · scale_b (a grouped GEMM: each group's own); mx:"
        " MXFP8, an e8m0 scale per 32 of K of each row of A and each column of B, promoted every 32",
    )
    if split:  # a GEMM's epilogue may read vectors of C's rows and a tensor of C's shape; a grouped GEMM's not yet
        g.add_argument(
            "--row-scale",
            action="store_true",
            help="epilogue: multiply each row by its value of row_scale (M values: a per-token scale), first",
        )
        g.add_argument(
            "--col-scale",
            action="store_true",
            help="epilogue: multiply each column by its value of col_scale (N values: a per-channel scale), next",
        )
    g.add_argument(
        "--bias", action="store_true", help="epilogue: add a bias vector (one value per column), after the scales"
    )
    g.add_argument("--relu", action="store_true", help="epilogue: max(x, 0), after the bias")
    g.add_argument(
        "--activation",
        action="append",
        choices=ACTIVATIONS,
        default=[],
        metavar="NAME",
        help=f"epilogue: an activation ({', '.join(a for a in ACTIVATIONS if a != 'gelu')}; float programs; bare"
        " gelu is gelu_tanh, with a note), after relu; may repeat",
    )
    g.add_argument(
        "--scalar",
        action="append",
        type=_scalar,
        default=[],
        metavar="OP,VALUE",
        help="epilogue: x OP VALUE (OP one of add, mul, max, min), after the activations; may repeat",
    )
    if split:
        g.add_argument(
            "--residual",
            action="store_true",
            help="epilogue: add the M×N input tensor residual (the precision's values), after the scalars",
        )
        g.add_argument(
            "--gate", action="store_true", help="epilogue: multiply by the M×N input tensor gate, after the residual"
        )
    g.add_argument(
        "--requant", type=_requant, metavar="SCALE[,ZP]", help="epilogue: requantise to int8 (int8 programs), last"
    )
    _output_options(g)


def _precision_options(g: argparse.ArgumentParser, default: str, out_help: str, *, floats_only: bool = False) -> None:
    """--precision, --target, --out; `floats_only`: a program of 16-bit float operands and float outputs alone
    (attention, whose softmax is float arithmetic)."""
    # fp32 is every command's choice: a program with a matmul refuses it in one line that says the fix (exit 2).
    if floats_only:
        g.add_argument(
            "--precision",
            default=default,
            choices=["fp16", "bf16", "fp32"],
            help=f"operand type (default: {default}; fp32 is refused: no matmul takes float32 operands)",
        )
    else:
        g.add_argument(
            "--precision",
            default=default,
            choices=["int8", "fp16", "bf16", "e4m3", "e5m2", "fp32"],
            help=f"operand type (default: {default}); e4m3 and e5m2 are the 8-bit floats float8_e4m3fn and float8_e5m2,"
            " multiplied by kernels for sm_89 and later (on sm_80 / sm_86 --run is the interpreter's), mapped on any;"
            " fp32 (float32) for programs with no matmul alone (elementwise, softmax, rmsnorm, layernorm)",
        )
    g.add_argument("--target", default="sm_90", help=f"GPU to plan for, one of {', '.join(TARGETS)} (default: sm_90)")
    outs = ["float32", "fp16", "bf16"] if floats_only else ["int32", "int64", "float32", "fp16", "bf16"]
    g.add_argument("--out", choices=outs, default=None, help=out_help)


def _placement_options(g: argparse.ArgumentParser, matmul: bool = True) -> None:
    """--depth, --sites, --placement; grouped and hilbert (orders of a GEMM's items) only for a program with a
    matmul."""
    g.add_argument("--depth", type=int, help="force the operand rings' depth, in pages (default: the cost model's)")
    g.add_argument("--sites", type=int, help="number of sites (default: as many as the target keeps resident)")
    g.add_argument(
        "--placement",
        choices=["contiguous", "round_robin", "grouped", "hilbert", "split_tail"]
        if matmul
        else ["contiguous", "round_robin"],
        default=None,
        help="how items go to sites (default: grouped — round-robin over bands of rows — where the sites take more"
        " than one wave of items, else contiguous; hilbert: round-robin along a Hilbert curve over the items;"
        " split_tail: grouped whole waves, then each item of the last, short wave split over the sites it leaves"
        " idle, general form)"
        if matmul
        else "how items go to sites: runs of items, or item i on site i mod sites (default: contiguous)",
    )


def _output_options(g: argparse.ArgumentParser) -> None:
    """What is checked and written: --check, the run options, --json, --show, --sass, --pictures."""
    g.add_argument(
        "--check",
        choices=["full", "sampled", "none"],
        help="what the reference interpreter computes and checks against numpy: full (all of C), sampled (every op"
        " runs, but only 4 tile rows of C are computed and checked: the first, the last and two drawn from --seed)"
        " or none (default: full up to 2^30 multiply-adds, where it fits the interpreter's 2 GiB, else sampled; a"
        " program whose rows a sample cannot follow, an attention or several matmuls, takes full or none)",
    )
    run_options(g, with_run=True)
    g.add_argument("--json", type=Path, metavar="FILE", help="save the verified program as JSON")
    g.add_argument("--show", action="store_true", help="print the program's choreography (its first two sites)")
    g.add_argument(
        "--sass",
        action="store_true",
        help="compile the kernel here and count its main loop's SASS (needs nvcc and cuobjdump: pip install "
        "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)",
    )
    g.add_argument(
        "--pictures",
        type=Path,
        metavar="DIR",
        help="write placement.svg (items on sites) and timeline.svg (a site's engines and rings over the whole run, in"
        " columns of a few ticks where the run is long)",
    )
    g.add_argument(
        "--pictures-site", type=count, metavar="N", help="with --pictures: the site timeline.svg draws (default: 0)"
    )
    g.add_argument(
        "--pictures-window",
        type=_window,
        metavar="START:END",
        help="with --pictures: the ticks timeline.svg draws, START ≤ tick < END (default: the whole run)",
    )


def run_options(p: argparse.ArgumentParser, *, with_run: bool) -> None:
    """The options of a run on random inputs; `with_run`: the kernel runs only when --run asks (spatialc gemm)."""
    p.add_argument("--seed", type=count, default=0, help="seed of the random inputs, a whole number ≥ 0 (default: 0)")
    p.add_argument(
        "--emit",
        type=Path,
        metavar="DIR",
        help="lower to CUDA and write program.cu, bench.cu, kernel.cu, launch.json, budget.json, census.json to DIR",
    )
    if with_run:
        p.add_argument(
            "--run",
            action="store_true",
            help="run the CUDA kernel: on the GPU when there is one, else in the emulation",
        )
    p.add_argument(
        "--mode",
        choices=["late", "early"],
        help="when the emulation's cp.async copies land: late (at the wait) or early (at issue)"
        + (" (with --run; default: late)" if with_run else " (default: late)"),
    )
    p.add_argument("--progress", action="store_true", help="report a long emulation's progress even when piped")
    p.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help="the emulation's wall-clock limit in seconds (default: SPATIALC_EMU_TIMEOUT_S, else 120); one whose pace"
        " says it would take more than twice that is stopped early, saying how long it would take",
    )
    form_option(p)


def _seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"a positive number of seconds, not {text!r}")
    return value


def form_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--form",
        choices=["auto", "persistent", "general", "sm90a"],
        default="auto",
        help="the CUDA kernel: auto (on --target sm_90a the sm_90a form — a TMA producer and wgmma consumers — where "
        "it holds the program; else the persistent tile kernel where it holds it, else the general form with each "
        "engine on its own warps; a program without a matmul: the general form), persistent, general or sm90a "
        "(default: auto)",
    )
