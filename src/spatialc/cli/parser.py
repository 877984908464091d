"""The `spatialc` command line: one argparse parser a command (`gemm`, `grouped-gemm`, `elementwise`, the row
programs, `attention`, and `show`, `verify`, `lower`, `run` of a saved program), built of the options they share
(`options.py`). A command line that cannot be run as written is a `UsageError`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from .options import count, form_option, page_options, program_options, run_options, sizes

DESCRIPTION = (
    "The `spatialc` command: build, verify, evaluate, lower and run GEMMs; show, verify, lower and run saved programs;"
    "\ncheck a GPU."
)
EPILOG = (
    "exit status: 0 done, 1 a result differs from the reference, 2 bad input (one line on stderr says what),"
    " 3 an internal error (a bug: re-run with --traceback and report it)"
)


class UsageError(Exception):
    """A command line that cannot be run as written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


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
    program_options(g, split=True)
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
        type=sizes,
        metavar="M0,M1,…",
        help="each group's row count, G whole numbers in 0..MAXROWS (default: drawn at random from --seed)",
    )
    program_options(g, split=False)


def _elementwise_parser(sub) -> None:
    g = sub.add_parser(
        "elementwise",
        help="build, verify and check out = EXPR(inputs) element by element; optionally emit CUDA and run it",
        description="Build out[M×N] = EXPR, element by element, where EXPR is a formula of the elementwise ops"
        " (silu(g) * x + col(bias); spatialc.numerics.elementwise lists them) over input tensors of M×N values —"
        " its other names, or --inputs — column vectors col(NAME) of N values and row vectors row(NAME) of M values"
        " (or several outputs, 'out1 = x1 * c - x2 * s; out2 = x2 * c + x1 * s': one M×N output each, one kernel);"
        " verify it, evaluate it with the"
        " reference interpreter and check it against numpy; with --emit / --run, lower it to CUDA (the general form;"
        " --form persistent for the persistent one) and run it. Sizes are in elements; tiles are 16x16 elements; a"
        " block is in tiles.",
        epilog=EPILOG,
    )
    g.add_argument(
        "expr",
        help="the formula, e.g. 'silu(g) * x', or outputs 'NAME = EXPR; NAME = EXPR' (quote it for the shell)",
    )
    g.add_argument("m", type=int, help="M: rows of each input and of out (elements)")
    g.add_argument("n", type=int, help="N: columns of each input and of out (elements)")
    g.add_argument(
        "--inputs",
        type=lambda t: tuple(t.split(",")),
        metavar="NAME,…",
        help="the inputs' names in the order the program takes them (default: as the formula first uses them)",
    )
    page_options(
        g,
        "out's element type: float32, fp16 or bf16 for float programs, int32 or int64 for int8 ones (default: float32,"
        " int64)",
        "force an item's block: ROWS x COLS tiles (default: the cost model's)",
    )


def _rows_parser(sub, name: str, what: str, formula: str, shape: str = "M×N") -> argparse.ArgumentParser:
    """`softmax`, `rmsnorm`, `layernorm` and `row-reduce`: a program that reduces each row of x (M×N), then maps it
    (out is `shape`: M×N, or M×1 for a row reduction)."""
    g = sub.add_parser(
        name,
        help=f"build, verify and check {what} of each row of x (M×N), a program that reduces rows",
        description=f"Build out[{shape}] = {formula} along each row of x, a spatial program of reads, row reductions"
        " and maps; verify it (rule 8 proves each reduction covers every column of its row once), evaluate it with the"
        " reference interpreter and check it against numpy. The general CUDA form prints its kernel (--emit, --run;"
        " --form persistent for the persistent one). Sizes are in elements; tiles are 16x16 elements; a block is in"
        " tiles.",
        epilog=EPILOG,
    )
    g.add_argument("m", type=int, help="M: rows of x and out (elements)")
    of = "x and out" if shape == "M×N" else "x"
    g.add_argument("n", type=int, help=f"N: columns of {of}, the length of a row reduced (elements)")
    page_options(
        g,
        "out's element type: float32, fp16 or bf16 (default: float32)",
        "force the block: bands of ROWS tile rows read a page of COLS tiles at a time (default: the cost model's)",
    )
    return g


def _row_reduce_parser(sub) -> None:
    """`row-reduce`: out[M×1] = one reduction of each row of x (`spatialc.row_reduce`)."""
    from ..rows import ROW_REDUCTIONS

    g = _rows_parser(
        sub,
        "row-reduce",
        "a reduction",
        "OP(x) (sum, mean, max, min, absmax: max |x|, an fp8 quantiser's per-token scale, sumsq: Σx², or logsumexp:"
        " max + log Σ exp(x − max), in one pass; reduced in float32)",
        "M×1",
    )
    g.add_argument("--op", choices=ROW_REDUCTIONS, default="sum", help="the reduction (default: sum)")


def _col_reduce_parser(sub) -> None:
    """`col-reduce`: out[1×N] = one reduction of each column of x (`spatialc.col_reduce`)."""
    from ..cols import COL_REDUCTIONS

    g = sub.add_parser(
        "col-reduce",
        help="build, verify and check a reduction of each column of x (M×N), a program that reduces columns",
        description="Build out[1×N] = OP over each column of x (sum, mean, max, min, absmax: max |x|, sumsq: Σx²;"
        " reduced in float32: x.sum(0), a bias gradient), a spatial program of a read, a column reduction and its"
        " write; verify it (rule 8 proves each band's row pages reduced once), evaluate it with the reference"
        " interpreter and check it against numpy. The general CUDA form prints its kernel (--emit, --run). Sizes are in"
        " elements; tiles are 16x16 elements; a block is in tiles.",
        epilog=EPILOG,
    )
    g.add_argument("m", type=int, help="M: rows of x, the length of a column reduced (elements)")
    g.add_argument("n", type=int, help="N: columns of x and out (elements)")
    page_options(
        g,
        "out's element type: float32, fp16 or bf16 (default: float32)",
        "force the block: pages of ROWS tile rows down bands of COLS tile columns (default: the cost model's)",
    )
    g.add_argument("--op", choices=COL_REDUCTIONS, default="sum", help="the reduction (default: sum)")


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
    page_options(
        g,
        "O's element type: float32, fp16 or bf16 (default: float32; LSE is float32)",
        "force the block: bands of ROWS query tile rows walk the keys COLS tile rows at a time (default: 4,4, no"
        " more than a head's rows, halved where the general form's block would not fit a site: 4,2 on sm_86 and"
        " sm_89 at head_dim 128)",
        floats_only=True,
    )


def make_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="spatialc", description=DESCRIPTION, epilog=EPILOG)
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
    ls = _rows_parser(sub, "log-softmax", "the log-softmax", "x − max(x) − log Σ exp(x − max(x))")
    ls.add_argument(
        "--online",
        action="store_true",
        help="two passes over each row, not three: the max and the sum of exp kept running in one (as attention's)",
    )
    r = _rows_parser(sub, "rmsnorm", "the RMS norm", "x · rsqrt(mean(x²) + eps) · weight")
    r.add_argument("--eps", type=float, default=1e-6, help="added to the mean of squares (default: 1e-6)")
    r.add_argument("--no-weight", action="store_true", help="no weight vector: out = x · rsqrt(mean(x²) + eps)")
    r.add_argument(
        "--residual",
        action="store_true",
        help="fused add + RMSNorm (vLLM's fused_add_rms_norm): a second input residual[M×N], h = x + residual, out ="
        " h · rsqrt(mean(h²) + eps) · weight and residual_out[M×N] = h (x's type) written too",
    )
    _row_reduce_parser(sub)
    _col_reduce_parser(sub)
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
    s.add_argument("--sites", type=count, default=2, help="how many sites' programs to list (default: 2)")
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
    form_option(low)
    r = sub.add_parser(
        "run",
        help="run a saved program on random inputs: the interpreter against numpy, then its kernel (GPU or emulation)",
        epilog=EPILOG,
    )
    r.add_argument("file", type=Path, help="the program's JSON document")
    run_options(r, with_run=False)
    # Listed for --help only: main() hands everything after `gpucheck` to the script's own parser.
    sub.add_parser(
        "gpucheck",
        help="check and time every kernel against cuBLAS and Triton on a GPU; --prepare compiles them beforehand "
        "(spatialc gpucheck --help)",
        add_help=False,
    )
    return parser
