"""The `spatialc` command: build, verify, evaluate, lower and run GEMMs; show, verify, lower and run saved programs;
check a GPU."""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

from ..errors import SpatialError, clipped
from ..frontend import DEFAULT_PRECISION
from ..ir.ops import ACTIVATIONS
from ..target import TARGETS

EPILOG = (
    "exit status: 0 done, 1 a result differs from the reference, 2 bad input (one line on stderr says what),"
    " 3 an internal error (a bug: re-run with --traceback and report it)"
)
EXIT_INTERNAL = 3
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


def _gemm_parser(sub) -> None:
    g = sub.add_parser(
        "gemm",
        help="build, verify and check C = epilogue(A @ B); optionally emit CUDA and run it",
        description="Build C[M×N] = epilogue(A[M×K] @ B[K×N]), verify it, evaluate it on random inputs with the"
        " reference interpreter and check it against numpy; with --emit / --run, lower it to CUDA and run it (on the"
        " GPU when there is one, otherwise through the host emulation). Sizes are in elements; tiles are 16x16"
        " elements; block, sub-block and K-step sizes are in tiles.",
        epilog=EPILOG,
    )
    g.add_argument("m", type=int, help="M: rows of A and of C (elements)")
    g.add_argument("n", type=int, help="N: columns of B and of C (elements)")
    g.add_argument("k", type=int, help="K: columns of A, rows of B: the reduction's length (elements)")
    _program_options(g, split=True)
    w = g.add_argument_group("4-bit weights (W4A16: B dequantised to the bf16 / fp16 operand on the way in)")
    w.add_argument("--weights", choices=["int4", "uint4", "mxfp4"], help="B's stored format (default: the precision)")
    w.add_argument(
        "--group", type=int, metavar="G", help="rows of K per scale (default 128; mxfp4's is 32): K a multiple of G"
    )
    w.add_argument("--zeros", action="store_true", help="a zero point per group and column beside each scale")
    w.add_argument(
        "--scale-type", choices=["bf16", "fp16", "float32"], help="int4 / uint4 scales' type (default: the precision)"
    )


def _grouped_parser(sub) -> None:
    g = sub.add_parser(
        "grouped-gemm",
        help="build, verify and check a grouped GEMM whose row counts arrive at run time (a mixture-of-experts layer)",
        description="Build C[g, :m_g] = epilogue(A[g, :m_g] @ B[g]) for G groups of at most MAXROWS rows each"
        " (A: G×MAXROWS×K, B: G×K×N, C: G×MAXROWS×N; the row counts m_g are the int32 tensor `sizes`, read at run"
        " time: rows at or past m_g are neither read nor written), verify it, evaluate it with the reference"
        " interpreter and check it against numpy; with --emit / --run, lower it to CUDA (the general form) and run"
        " it.",
        epilog=EPILOG,
    )
    g.add_argument("groups", type=int, help="G: the number of groups (experts)")
    g.add_argument("max_rows", type=int, help="MAXROWS: the most rows a group has (elements)")
    g.add_argument("n", type=int, help="N: columns of each B and C (elements)")
    g.add_argument("k", type=int, help="K: columns of each A, rows of each B (elements)")
    g.add_argument(
        "--sizes",
        type=_sizes,
        metavar="M0,M1,…",
        help="each group's row count, G whole numbers in 0..MAXROWS (default: drawn at random from --seed)",
    )
    _program_options(g, split=False)


def _elementwise_parser(sub) -> None:
    g = sub.add_parser(
        "elementwise",
        help="build, verify and check out = EXPR(inputs) element by element; optionally emit CUDA and run it",
        description="Build out[M×N] = EXPR, element by element, where EXPR is a formula of the elementwise ops"
        " (silu(g) * x + col(bias); spatialc.numerics.elementwise lists them) over input tensors of M×N values —"
        " its other names, or --inputs — column vectors col(NAME) of N values and row vectors row(NAME) of M values;"
        " verify it, evaluate it with the"
        " reference interpreter and check it against numpy; with --emit / --run, lower it to CUDA (the general form;"
        " --form persistent for the persistent one) and run it. Sizes are in elements; tiles are 16x16 elements; a"
        " block is in tiles.",
        epilog=EPILOG,
    )
    g.add_argument("expr", help="the formula, e.g. 'silu(g) * x' (quote it for the shell)")
    g.add_argument("m", type=int, help="M: rows of each input and of out (elements)")
    g.add_argument("n", type=int, help="N: columns of each input and of out (elements)")
    g.add_argument(
        "--inputs",
        type=lambda t: tuple(t.split(",")),
        metavar="NAME,…",
        help="the inputs' names in the order the program takes them (default: as the formula first uses them)",
    )
    _page_options(
        g,
        "out's element type: float32, fp16 or bf16 for float programs, int32 or int64 for int8 ones (default: float32,"
        " int64)",
        "force an item's block: ROWS x COLS tiles (default: the cost model's)",
    )


def _rows_parser(sub, name: str, what: str, formula: str) -> argparse.ArgumentParser:
    """`softmax`, `rmsnorm` and `layernorm`: a program that reduces each row of x (M×N), then maps it."""
    g = sub.add_parser(
        name,
        help=f"build, verify and check {what} of each row of x (M×N), a program that reduces rows",
        description=f"Build out[M×N] = {formula} along each row of x, a spatial program of reads, row reductions and"
        " maps; verify it (rule 8 proves each reduction covers every column of its row once), evaluate it with the"
        " reference interpreter and check it against numpy. The general CUDA form prints its kernel (--emit, --run;"
        " --form persistent for the persistent one). Sizes are in elements; tiles are 16x16 elements; a block is in"
        " tiles.",
        epilog=EPILOG,
    )
    g.add_argument("m", type=int, help="M: rows of x and out (elements)")
    g.add_argument("n", type=int, help="N: columns of x and out, the length of a row reduced (elements)")
    _page_options(
        g,
        "out's element type: float32, fp16 or bf16 (default: float32)",
        "force the block: bands of ROWS tile rows read a page of COLS tiles at a time (default: the cost model's)",
    )
    return g


def _page_options(g: argparse.ArgumentParser, out_help: str, block_help: str, *, floats_only: bool = False) -> None:
    """The options of a program without a tile matmul of its own plan (elementwise, the row programs, attention):
    precision, target, a block of ROWS x COLS tiles, placement, and what is checked, run and written."""
    _precision_options(g, "bf16", out_help, floats_only=floats_only)
    g.add_argument("--block", type=_ints(2, "--block"), metavar="ROWS,COLS", help=block_help)
    _placement_options(g, matmul=False)
    g.set_defaults(sub_blocks=None)
    _output_options(g)


def _attention_parser(sub) -> None:
    from ..lower.cuda.sm90a.overlap import SCHEDULES

    g = sub.add_parser(
        "attention",
        help="build, verify and check scaled dot-product attention: O = softmax(scale · Q·Kᵀ + mask) · V and LSE",
        description="Build O = softmax(scale · Q·Kᵀ + mask) · V for each batch and query head, and LSE, the log of"
        " each row's sum (Q: B×H×SQ×D, K and V: B×KVH×SKV×D; query head h reads KV head h // (H / KVH)), a spatial"
        " program running FlashAttention's online recurrence over blocks of keys; verify it (rule 8 proves the"
        " schedule runs that recurrence, equal to the softmax), evaluate it with the reference interpreter and check"
        " it against numpy. The general CUDA form prints it (--emit, --run, --sass); --form persistent or sm90a is"
        " refused. Sizes are in elements; tiles are 16x16 elements; a block is in tiles.",
        epilog=EPILOG,
    )
    g.add_argument("batch", type=int, help="B: the batch")
    g.add_argument("heads", type=int, help="H: query heads")
    g.add_argument("seq_q", type=int, help="SQ: query rows a head (elements)")
    g.add_argument("seq_kv", type=int, help="SKV: key and value rows a head (elements)")
    g.add_argument("head_dim", type=int, help="D: each row's length, at most 256 (elements)")
    g.add_argument(
        "--causal",
        action="store_true",
        help="mask key c for query row r where c > r + SKV − SQ (aligned bottom right, as FlashAttention; SQ ≤ SKV)",
    )
    g.add_argument(
        "--kv-heads",
        type=int,
        metavar="N",
        help="KV heads (grouped-query attention: H a multiple of N; default: H, one KV head a query head)",
    )
    g.add_argument("--scale", type=float, metavar="S", help="the scores' factor, > 0 (default: 1/√D)")
    g.add_argument(
        "--schedule",
        choices=SCHEDULES,
        help="the sm_90a form's KV loop: serial (each matmul waited for), overlapped (each block's softmax under"
        " the next block's S) or pingpong (two consumer warpgroups, --block 8,COLS, taking turns: each softmax under"
        " the other's matmuls; FlashAttention-3's) (default: pingpong for two consumer warpgroups, overlapped for"
        " one, where its registers fit and K and V have two stages; else serial). A schedule the kernel cannot take"
        " is refused",
    )
    _page_options(
        g,
        "O's element type: float32, fp16 or bf16 (default: float32; LSE is float32)",
        "force the block: bands of ROWS query tile rows walk the keys COLS tile rows at a time (default: 4,4, no"
        " more than a head's rows, halved where the general form's block would not fit a site: 4,2 on sm_86 and"
        " sm_89 at head_dim 128)",
        floats_only=True,
    )


def _sizes(text: str) -> tuple[int, ...]:
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


def _program_options(g: argparse.ArgumentParser, *, split: bool) -> None:
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
    if floats_only:
        g.add_argument(
            "--precision", default=default, choices=["fp16", "bf16"], help=f"operand type (default: {default})"
        )
    else:
        g.add_argument(
            "--precision",
            default=default,
            choices=["int8", "fp16", "bf16", "e4m3", "e5m2"],
            help=f"operand type (default: {default}); e4m3 and e5m2 are the 8-bit floats float8_e4m3fn and float8_e5m2,"
            " multiplied by kernels for sm_89 and later (on sm_80 / sm_86 --run is the interpreter's), mapped on any",
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
        choices=["contiguous", "round_robin", "grouped", "hilbert"] if matmul else ["contiguous", "round_robin"],
        default=None,
        help="how items go to sites (default: grouped — round-robin over bands of rows — where the sites take more"
        " than one wave of items, else contiguous; hilbert: round-robin along a Hilbert curve over the items)"
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
    _run_options(g, with_run=True)
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
        "--pictures-site", type=_count, metavar="N", help="with --pictures: the site timeline.svg draws (default: 0)"
    )
    g.add_argument(
        "--pictures-window",
        type=_window,
        metavar="START:END",
        help="with --pictures: the ticks timeline.svg draws, START ≤ tick < END (default: the whole run)",
    )


def _run_options(p: argparse.ArgumentParser, *, with_run: bool) -> None:
    """The options of a run on random inputs; `with_run`: the kernel runs only when --run asks (spatialc gemm)."""
    p.add_argument("--seed", type=_count, default=0, help="seed of the random inputs, a whole number ≥ 0 (default: 0)")
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
    _form_option(p)


def _form_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--form",
        choices=["auto", "persistent", "general", "sm90a"],
        default="auto",
        help="the CUDA kernel: auto (on --target sm_90a the sm_90a form — a TMA producer and wgmma consumers — where "
        "it holds the program; else the persistent tile kernel where it holds it, else the general form with each "
        "engine on its own warps; a program without a matmul: the general form), persistent, general or sm90a "
        "(default: auto)",
    )


def make_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="spatialc", description=__doc__, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"spatialc {__version__}")
    parser.add_argument(
        "--traceback", action="store_true", help="on an internal error, show the Python traceback (for a bug report)"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    _gemm_parser(sub)
    _grouped_parser(sub)
    _elementwise_parser(sub)
    s = _rows_parser(sub, "softmax", "the softmax", "exp(x − max(x)) / Σ exp(x − max(x))")
    s.add_argument(
        "--online",
        action="store_true",
        help="two passes over each row, not three: the max and the sum of exp kept running in one (as attention's)",
    )
    r = _rows_parser(sub, "rmsnorm", "the RMS norm", "x · rsqrt(mean(x²) + eps) · weight")
    r.add_argument("--eps", type=float, default=1e-6, help="added to the mean of squares (default: 1e-6)")
    r.add_argument("--no-weight", action="store_true", help="no weight vector: out = x · rsqrt(mean(x²) + eps)")
    n = _rows_parser(
        sub,
        "layernorm",
        "the layer norm",
        "(x − mean) · rstd · weight + bias, with mean[M×1] = Σx / N and rstd[M×1] = rsqrt(Σ(x − mean)² / N + eps)"
        " written too",
    )
    n.add_argument("--eps", type=float, default=1e-5, help="added to the variance (default: 1e-5)")
    n.add_argument("--no-weight", action="store_true", help="no weight vector: out = (x − mean) · rstd + bias")
    n.add_argument("--no-bias", action="store_true", help="no bias vector: out = (x − mean) · rstd · weight")
    _attention_parser(sub)
    s = sub.add_parser("show", help="print a saved program", epilog=EPILOG)
    s.add_argument("file", type=Path, help="a program saved by `spatialc gemm --json` or spatialc.to_json")
    s.add_argument("--sites", type=_count, default=2, help="how many sites' programs to list (default: 2)")
    s.add_argument(
        "--python",
        action="store_true",
        help="print it as spatialc.lang source instead: a Python module whose program() traces it again",
    )
    v = sub.add_parser(
        "verify",
        help="verify a saved (possibly hand-edited) program and say which lowering takes it",
        epilog=EPILOG,
    )
    v.add_argument("file", type=Path, help="the program's JSON document")
    v.add_argument("--pictures", type=Path, metavar="DIR", help="on a deadlock, draw its wait-for graph into DIR")
    low = sub.add_parser("lower", help="lower a saved program to CUDA and write its files", epilog=EPILOG)
    low.add_argument("file", type=Path, help="the program's JSON document")
    low.add_argument("--emit", type=Path, metavar="DIR", required=True, help="where to write the kernel's files")
    low.add_argument("--sass", action="store_true", help="count the main loop's SASS (needs nvcc and cuobjdump)")
    _form_option(low)
    r = sub.add_parser(
        "run",
        help="run a saved program on random inputs: the interpreter against numpy, then its kernel (GPU or emulation)",
        epilog=EPILOG,
    )
    r.add_argument("file", type=Path, help="the program's JSON document")
    _run_options(r, with_run=False)
    # Listed for --help only: main() hands everything after `gpucheck` to the script's own parser.
    sub.add_parser(
        "gpucheck",
        help="check and time every kernel against cuBLAS and Triton on a GPU; --prepare compiles them beforehand "
        "(spatialc gpucheck --help)",
        add_help=False,
    )
    return parser


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
