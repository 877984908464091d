"""Print the persistent kernel: its preamble, the work list, and one small printer per choreography op.

Each op's image starts with a line ending in its census marker (`spatialc.lower.census`). Every name the kernel
uses follows from ids and loop variables, so the same program always prints the same text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ...ir.ids import LV_ITEM, LV_ITEM_X, LV_ITEM_Y, LoopVar, loop_var_name
from ...ir.nodes import Plan, SpatialProgram, TensorRole
from ...ir.ops import (
    AcquireAcc,
    Bias,
    Compute,
    ComputeOp,
    Flush,
    MatmulTiles,
    PackAcc,
    Pop,
    Push,
    ReadBarrier,
    ReadTiles,
    ReleaseAcc,
    Reserve,
    TileAddr,
    Wait,
    WriteBarrier,
    WriteTiles,
)
from ...ir.printer import compute_text
from ..census import OP, PAD, PRE, marker
from ..errors import Unsupported
from . import epilogue
from .merge import SerialLoop, SerialOp
from .rings import TILE_ELEMS, Ring, Rings, SmemLayout, WmmaTypes, barrier_free_pops, commits, rotation

KERNEL_NAME = "spatialc_persistent"
INCLUDES = ("cuda_pipeline.h", "mma.h", "cuda_bf16.h", "cuda_fp16.h", "cstdio", "cstdlib", "vector", "cstring")
RING_MACROS = """#ifndef SPATIALC_SHARED_RING
#define SPATIALC_SHARED_RING(T, name, depth, page) __shared__ __align__(32) T name[(depth) * (page)]
#define SPATIALC_DYNAMIC_RING(T, name, base, off, depth, page) T* name = reinterpret_cast<T*>((base) + (off))
#endif"""
CHECK_MACRO = (
    "#define SPATIALC_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "
    '"CUDA error: %s (%s)\\n", cudaGetErrorString(e_), #x); exit(1); } } while (0)'
)
WMMA = "nvcuda::wmma::"
POP_PROOF = "these slots are refilled only after the next wait barrier"


@dataclass(frozen=True, slots=True)
class Kernel:
    """Everything the printers read, decided and proved before a line is printed."""

    program: SpatialProgram
    plan: Plan
    types: WmmaTypes
    out_type: str  # OUT_T, the output tensor's element type
    param_types: tuple[str, ...]  # each tensor's pointee type, in tensor-id order
    rings: Rings
    smem: SmemLayout
    lane_grid: tuple[int, int] | None
    lanes: int
    perw: int
    blocks_per_sm: int
    items: tuple[tuple[int, ...], ...]  # each site's items, in blockIdx order
    integer: bool  # the epilogue's arithmetic: exact int64 (int8 programs) or float32
    has_epilogue: bool  # elementwise stages are fused into the store (their helpers are printed)

    @property
    def item_tiles(self) -> tuple[int, int]:
        """Output tiles of one item: (sh·osh, sw·osw)."""
        return self.plan.item_tiles


class Writer:
    """Lines of C with an indent, each optionally ending in a census marker."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def line(self, text: str = "", mark: str = "") -> None:
        """One line at the current indent; `mark` (a census marker) ends it."""
        body = f"{text}  {mark}" if text and mark else (text or mark)
        self.lines.append(("    " * self.depth + body) if body else "")

    @contextmanager
    def block(self, head: str = "", mark: str = "") -> Iterator[None]:
        """`head {`, an indented body, `}`."""
        self.line(f"{head} {{" if head else "{", mark)
        self.depth += 1
        yield
        self.depth -= 1
        self.line("}")

    def text(self) -> str:
        """The lines written so far, as one text."""
        return "\n".join(self.lines) + "\n"


def _sum(*terms: str) -> str:
    """C terms joined by `+`, the empty ones left out."""
    return " + ".join(t for t in terms if t) or "0"


def _mul(e: str, n: int) -> str:
    """`e · n` as C ("" when `e` is absent)."""
    return "" if not e else e if n == 1 else f"{e} * {n}"


def _div(e: str, n: int) -> str:
    return e if n == 1 else f"{e} / {n}"


def _mod(e: str, n: int) -> str:
    """`e mod n` as C ("" when n is 1: it is zero)."""
    return "" if n == 1 else f"{e} % {n}"


def addr_expr(at: TileAddr, env: dict[LoopVar, str]) -> str:
    """A tile address as C over the loop variables bound in `env` (variable → C expression)."""
    terms = [str(at.base)] if at.base else []
    for var, stride in at.steps:
        if stride == 0:
            continue
        if var not in env:
            raise Unsupported(
                f"an address over {loop_var_name(var)} outside any loop that binds it",
                "the kernel has no value for that variable there",
            )
        if env[var] != "0":
            terms.append(f"{env[var]} * {stride}" if stride != 1 else env[var])
    return _sum(*terms)


class OpPrinter:
    """Prints a serial program's ops into a Writer; one method per op kind."""

    def __init__(self, k: Kernel, w: Writer, free_pops: frozenset[int] = frozenset()):
        self.k = k
        self.w = w
        # The rings whose pops need no barrier (`rings.barrier_free_pops` proves it from the printed order).
        self.free_pops = free_pops
        # The fused chain's stages met since the last store: (op, its addresses' variables, its C scope depth).
        self.chain: list[tuple[Compute, dict[LoopVar, str], int]] = []

    def ops(self, ops: tuple[SerialOp, ...], env: dict[LoopVar, str], in_flight: int = 0, tag: str = OP) -> None:
        """Print `ops`; `in_flight` commit groups issued ahead stay pending at their waits; `tag` marks copies."""
        for i, op in enumerate(ops):
            first = i == 0 or not self.same_run(ops[i - 1], op)
            run = () if i + 1 < len(ops) and self.same_run(ops[i + 1], op) else self.run_ending(ops, i)
            self.op(op, first, run, env, in_flight, tag)

    def op(
        self, op: SerialOp, first: bool, run: tuple[SerialOp, ...], env: dict[LoopVar, str], in_flight: int, tag: str
    ) -> None:
        """Print the image of one op; a Wait or Pop learns whether it starts its run, and the run it ends (or ())."""
        mark = marker(op, tag)
        rings = self.k.rings
        match op:
            case SerialLoop():
                self.loop(op, env, tag)
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) | PackAcc(to=buf) if rings.is_fused(buf):
                # The fused output has no ring: the accumulators already are the page its flow control governs.
                self.w.line("", f"{mark} (fused output: no ring)")
            case Reserve(buf):
                r = self.ring(buf)
                self.w.line(f"wslot_{r} = (wslot_{r} + 1) % DEPTH_{r};", mark)
            case Push():
                self.w.line("__pipeline_commit();", mark)
            case Wait():
                # A thread's wait completes only its own copies: the run's first wait_prior(n) completes all of
                # them, and the later ones would repeat it. The barrier after the run publishes everyone's.
                wait = [f"__pipeline_wait_prior({in_flight});"] if first else []
                sync = ["__syncthreads();"] if run else []
                self.w.line(" ".join(wait + sync), mark if wait or sync else f"{mark} (the wait above covers it)")
            case Pop(buf):
                # No thread may refill a slot another still reads: one barrier after a run of pops, unless the
                # next refill of every slot the run frees is proved to follow another barrier.
                r = self.ring(buf)
                line = f"rslot_{r} = (rslot_{r} + 1) % DEPTH_{r};"
                if not run:
                    self.w.line(line, mark)
                elif all(self.ring(p.buf) in self.free_pops for p in run if isinstance(p, Pop)):
                    self.w.line(line, f"{mark} (no barrier: {POP_PROOF})")
                else:
                    self.w.line(f"{line} __syncthreads();", mark)
            case ReadTiles():
                self.read_tiles(op, env, mark)
            case WriteTiles(src=buf) if rings.is_fused(buf):
                self.fused_store(op, env, mark)
            case WriteTiles():
                self.write_tiles(op, env, mark)
            case AcquireAcc():
                with self.unrolled("for (int q = 0; q < PERW; ++q)", mark):
                    self.w.line(f"{WMMA}fill_fragment(accf[q], 0);")
            case ReleaseAcc():
                self.w.line("", f"{mark} (accumulators stay in registers)")
            case ReadBarrier() | WriteBarrier() | Flush():
                self.w.line("", f"{mark} (ordered by the pipeline waits and barriers)")
            case Compute(op=MatmulTiles() as mm, ins=(a, b)):
                self.matmul(mm, self.kept(a), self.kept(b), mark)
            case Compute(op=stage, ins=(buf,)) if rings.is_fused(buf):
                # Applied element by element where the store reads the accumulators back; its image is there.
                self.w.line(f"// {compute_text(stage, self.k.program)}: applied in the fused store below")
                self.chain.append((op, env, self.w.depth))
            case PackAcc(to=buf):
                self.pack(self.kept(buf), mark)
            case _:
                raise Unsupported(f"a {type(op).__name__} op", "the persistent tile kernel has no image for it")

    def kept(self, buf) -> Ring:
        """The ring of `buf`, which the checks before printing guarantee is kept."""
        ring = self.k.rings.kept(buf)
        assert ring is not None
        return ring

    def ring(self, buf) -> int:
        """The id of `buf`'s ring, the suffix of its names in the kernel."""
        return self.kept(buf).id

    def run_kind(self, op: SerialOp) -> type | None:
        """Wait or Pop for such an op on a kept ring (the ops that run together under one barrier), else None."""
        if isinstance(op, Wait | Pop) and self.k.rings.kept(op.buf) is not None:
            return type(op)
        return None

    def same_run(self, other: SerialOp, op: SerialOp) -> bool:
        """Whether `other`, next to `op`, is in the same run: both Waits (or both Pops) on kept rings."""
        kind = self.run_kind(op)
        return kind is not None and self.run_kind(other) is kind

    def run_ending(self, ops: tuple[SerialOp, ...], i: int) -> tuple[SerialOp, ...]:
        """The run of Waits or Pops that ends with `ops[i]` (its image prints the run's barrier), or () if none."""
        if self.run_kind(ops[i]) is None:
            return ()
        start = i
        while start > 0 and self.same_run(ops[start - 1], ops[i]):
            start -= 1
        return ops[start : i + 1]

    # ---- loops -------------------------------------------------------------------------------------------

    def loop(self, lp: SerialLoop, env: dict[LoopVar, str], tag: str) -> None:
        """A `for` over the loop's variable (the ITEM loop over the site's share of the work list)."""
        v = loop_var_name(lp.var)
        bound = "n_items" if lp.var == LV_ITEM else str(lp.count.n)  # type: ignore[union-attr]
        mark = marker("Loop", tag, lp.merged)
        halves = rotation(self.k.rings, lp)
        if halves is not None:
            self.rotated(lp, halves, env, mark)
            return
        with self.w.block(f"for (int {v} = 0; {v} < {bound}; ++{v})", mark):
            inner = env | {lp.var: v}
            if lp.var == LV_ITEM:
                self.item_header(f"ITEM_LIST[item_off + {v}]")
                inner |= {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
            self.ops(lp.body, inner, 0, tag)

    def item_header(self, index: str) -> None:
        """The current item and its grid coordinates, read from the work list at `index`."""
        nx = self.k.plan.grid[1]
        self.w.line(f"const int item_id = {index};")
        self.w.line(f"const int item_y = item_id / {nx}, item_x = item_id % {nx};")
        self.w.line("(void)item_y; (void)item_x;")

    def rotated(self, lp: SerialLoop, halves, env: dict[LoopVar, str], mark: str) -> None:
        """The loop software-pipelined: step i+1's producer half is issued before step i's consumer half waits.

        Without it each step would issue its copies and wait for them at once, exposing the whole load latency
        every step. The producer's addresses are functions of the loop variable, so issuing it ahead needs only
        that variable rebound. The last step has nothing to fetch and commits empty groups instead, so the
        consumer's `wait_prior(n)` leaves exactly the groups issued ahead in flight on every step.
        """
        prod, cons = halves
        v, n = loop_var_name(lp.var), lp.count.n  # type: ignore[union-attr]
        ahead = commits(self.k.rings, prod)
        self.w.line(f"// the loop over {v} is pipelined: step 0's copies are issued before it")
        self.ops(prod, env | {lp.var: "0"}, 0, PRE)
        with self.w.block(f"for (int {v} = 0; {v} < {n}; ++{v})", mark):
            with self.w.block(f"if ({v} + 1 < {n})"):
                self.ops(prod, env | {lp.var: f"({v} + 1)"}, 0, OP)
            with self.w.block("else"):
                for _ in range(ahead):
                    self.w.line("__pipeline_commit();", marker("Push", PAD))
            self.ops(cons, env | {lp.var: v}, ahead, OP)

    # ---- data movement -------------------------------------------------------------------------------------

    def read_tiles(self, op: ReadTiles, env: dict[LoopVar, str], mark: str) -> None:
        """Every thread issues its share of the page as 16-byte copies, the width one cp.async moves."""
        ring = self.kept(op.into)
        r, bw = ring.id, op.block_w
        if ring.c_type != "OPT":
            raise Unsupported(f"a ReadTiles into {ring.name}", "only operand rings are filled from global memory")
        with self.w.block("", mark):
            self.w.line(f"constexpr int CHUNKS = (int)(sizeof(OPT) * {TILE_ELEMS} / 16);")
            self.w.line(
                f'static_assert(sizeof(OPT) * {TILE_ELEMS} % 16 == 0, "a tile is a whole number of 16-byte chunks");'
            )
            with self.w.block(f"for (int c = tid; c < {op.block_h * bw} * CHUNKS; c += NTHREAD)"):
                self.w.line("const int tl = c / CHUNKS, off = c % CHUNKS;")
                self.w.line(f"const long long tile = {self.tile_expr(op.at, env, bw, op.stride_h, op.stride_w)};")
                self.w.line(
                    f"__pipeline_memcpy_async(reinterpret_cast<char*>(ring_{r} + wslot_{r} * PAGE_{r} + tl * "
                    f"{TILE_ELEMS}) + off * 16, reinterpret_cast<const char*>(t{int(op.tensor)} + tile * "
                    f"{TILE_ELEMS}) + off * 16, 16);"
                )

    def tile_expr(self, at: TileAddr, env: dict[LoopVar, str], bw: int, sh: int, sw: int) -> str:
        """The global tile index of page tile `tl` of a `? × bw` block at `at` with strides (sh, sw)."""
        row = _mul(f"(long long)({_div('tl', bw)})", sh)
        col = _mul(f"(long long)(tl % {bw})" if bw > 1 else "", sw)
        return _sum(f"(long long)({addr_expr(at, env)})", row, col)

    def write_tiles(self, op: WriteTiles, env: dict[LoopVar, str], mark: str) -> None:
        """The front page of a ring to global memory, every thread a strided share of its elements."""
        ring = self.kept(op.src)
        r = ring.id
        n = op.block_h * op.block_w * TILE_ELEMS
        with self.w.block("", mark), self.w.block(f"for (int e = tid; e < {n}; e += NTHREAD)"):
            self.w.line(f"const int tl = e / {TILE_ELEMS}, el = e % {TILE_ELEMS};")
            self.w.line(f"const long long tile = {self.tile_expr(op.at, env, op.block_w, op.stride_h, op.stride_w)};")
            self.w.line(f"t{int(op.tensor)}[tile * {TILE_ELEMS} + el] = (OUT_T)ring_{r}[rslot_{r} * PAGE_{r} + e];")

    # ---- the tile matmul and its accumulators --------------------------------------------------------------

    def warp_coords(self) -> None:
        """Declare the warp's place in the lane grid (only the coordinates that vary, so none is unused)."""
        wm, wn = self.k.lane_grid  # type: ignore[misc]
        if wm > 1:
            self.w.line(f"const int wi = warp / {wn};")
        if wn > 1:
            self.w.line(f"const int wj = warp % {wn};")

    def rect(self) -> tuple[int, int, int, int, int, int]:
        """(wm, wn, rm, rn, sh, sw): the lane grid, each warp's rectangle, the sub-blocks."""
        wm, wn = self.k.lane_grid  # type: ignore[misc]
        blk, (sh, sw) = self.k.plan.block, self.k.plan.sub_blocks
        return wm, wn, blk.osh // wm, blk.osw // wn, sh, sw

    def place(self, a: str, b: str, i: str, j: str) -> tuple[str, str, str]:
        """Item row, item column and fragment index of row i, column j of this warp's rectangle in sub-block (a, b).

        Fragments are numbered q = ((a·sw + b)·rm + i)·rn + j: by sub-block first, so no two sub-blocks share one.
        """
        wm, wn, rm, rn, _, sw = self.rect()
        blk = self.k.plan.block
        row = _sum(_mul(a, blk.osh), _mul("wi" if wm > 1 else "", rm), i)
        col = _sum(_mul(b, blk.osw), _mul("wj" if wn > 1 else "", rn), j)
        return row, col, _sum(_mul(a, sw * rm * rn), _mul(b, rm * rn), _mul(i, rn), j)

    def owned_tile(self) -> str:
        """`bh`, `bw`: the item tile that fragment `q` of this warp holds."""
        _, _, rm, rn, sh, sw = self.rect()
        a = _div("q", sw * rm * rn) if sh > 1 else ""
        row, col, _ = self.place(a, _mod(_div("q", rm * rn), sw), _mod(_div("q", rn), rm), _mod("q", rn))
        return f"const int bh = {row}, bw = {col};"

    def frag(self, use: str, name: str) -> str:
        """The declaration of operand fragment(s) `name` for `use` (matrix_a / matrix_b)."""
        return f"{WMMA}fragment<{WMMA}{use}, 16, 16, 16, OPT, {WMMA}row_major> {name};"

    def matmul(self, mm: MatmulTiles, a: Ring, b: Ring, mark: str) -> None:
        """One K step for every sub-block of the item, accumulating in registers."""
        with self.w.block("", mark):
            if self.k.lane_grid is None:
                self.matmul_strided(mm, a, b)
            else:
                self.matmul_grid(mm, a, b)

    def matmul_grid(self, mm: MatmulTiles, a_ring: Ring, b_ring: Ring) -> None:
        """A warp owns one rectangle of every sub-block: per K tile it loads each B fragment of its columns once and
        each A fragment of its rows once, and makes every product of them."""
        _, _, rm, rn, sh, sw = self.rect()
        blk = mm.block
        a, i = (_div("r", rm) if sh > 1 else ""), _mod("r", rm)
        b, j = (_div("c", rn) if sw > 1 else ""), _mod("c", rn)
        row, col, q = self.place(a, b, i, j)
        self.warp_coords()
        with self.unrolled(f"for (int kk = 0; kk < {blk.ibw}; ++kk)"):
            self.w.line(self.frag("matrix_b", f"bf[{sw * rn}]"))
            with self.unrolled(f"for (int c = 0; c < {sw * rn}; ++c)"):
                self.w.line(
                    f"{WMMA}load_matrix_sync(bf[c], ring_{b_ring.id} + rslot_{b_ring.id} * PAGE_{b_ring.id} + "
                    f"(kk * {sw * blk.osw} + {col}) * {TILE_ELEMS}, 16);"
                )
            with self.unrolled(f"for (int r = 0; r < {sh * rm}; ++r)"):
                self.w.line(self.frag("matrix_a", "af"))
                self.w.line(
                    f"{WMMA}load_matrix_sync(af, ring_{a_ring.id} + rslot_{a_ring.id} * PAGE_{a_ring.id} + "
                    f"({_mul(f'({row})', blk.ibw)} + kk) * {TILE_ELEMS}, 16);"
                )
                with self.unrolled(f"for (int c = 0; c < {sw * rn}; ++c)"):
                    self.w.line(f"const int q = {q};")
                    self.w.line(f"{WMMA}mma_sync(accf[q], af, bf[c], accf[q]);")

    def matmul_strided(self, mm: MatmulTiles, a: Ring, b: Ring) -> None:
        """No lane grid divides the block: warp w owns item tiles w, w + NWARP, … — correct, and slower."""
        h, w = self.k.item_tiles
        ibw = mm.block.ibw
        with self.unrolled("for (int q = 0; q < PERW; ++q)"):
            self.w.line("const int ot = warp + q * NWARP;")
            with self.w.block(f"if (ot < {h * w})"):
                self.w.line(f"const int oi = ot / {w}, oj = ot % {w};")
                with self.unrolled(f"for (int kk = 0; kk < {ibw}; ++kk)"):
                    self.w.line(self.frag("matrix_a", "af"))
                    self.w.line(self.frag("matrix_b", "bf"))
                    self.w.line(
                        f"{WMMA}load_matrix_sync(af, ring_{a.id} + rslot_{a.id} * PAGE_{a.id} + "
                        f"({_mul('oi', ibw)} + kk) * {TILE_ELEMS}, 16);"
                    )
                    self.w.line(
                        f"{WMMA}load_matrix_sync(bf, ring_{b.id} + rslot_{b.id} * PAGE_{b.id} + "
                        f"({_mul('kk', w)} + oj) * {TILE_ELEMS}, 16);"
                    )
                    self.w.line(f"{WMMA}mma_sync(accf[q], af, bf, accf[q]);")

    @contextmanager
    def unrolled(self, head: str, mark: str = "") -> Iterator[None]:
        """A loop fully unrolled, so fragment arrays are indexed by constants and stay in registers."""
        self.w.line("#pragma unroll")
        with self.w.block(head, mark):
            yield

    def pack(self, ring: Ring, mark: str) -> None:
        """Store every accumulator fragment into its tile of the reserved page (row-major tiles of the item)."""
        h, w = self.k.item_tiles
        r = ring.id
        store = (
            f"{WMMA}store_matrix_sync(ring_{r} + wslot_{r} * PAGE_{r} + {{}} * {TILE_ELEMS}, accf[q], 16, "
            f"{WMMA}mem_row_major);"
        )
        with self.w.block("", mark):
            if self.k.lane_grid is None:
                with self.unrolled("for (int q = 0; q < PERW; ++q)"):
                    self.w.line("const int ot = warp + q * NWARP;")
                    with self.w.block(f"if (ot < {h * w})"):
                        self.w.line(store.format("ot"))
                return
            self.warp_coords()
            with self.unrolled("for (int q = 0; q < PERW; ++q)"):
                self.w.line(self.owned_tile())
                self.w.line(store.format(f"(bh * {w} + bw)"))

    def fused_store(self, op: WriteTiles, env: dict[LoopVar, str], mark: str) -> None:
        """The fused epilogue: each warp stores its fragments one at a time through its own one-tile scratch."""
        chain = self.fused_chain()
        with self.w.block("", mark):
            self.warp_coords()
            self.w.line("const int lane = tid % 32;")
            self.w.line(f"ACCT* scratch = epi_scratch + warp * {TILE_ELEMS};")
            with self.unrolled("for (int q = 0; q < PERW; ++q)"):
                self.w.line(self.owned_tile())
                base = addr_expr(op.at, env)
                rows, cols = _mul("(long long)bh", op.stride_h), _mul("(long long)bw", op.stride_w)
                self.w.line(f"const long long tile = {_sum(f'(long long)({base})', rows, cols)};")
                self.w.line(f"{WMMA}store_matrix_sync(scratch, accf[q], 16, {WMMA}mem_row_major);")
                # store_matrix_sync is warp-collective but no fence for the lanes' reads that follow; and the next
                # fragment's store must not overwrite the scratch before every lane has read it out.
                self.w.line("__syncwarp();")
                # Kept rolled: unrolled, its eight 64-bit addresses sit beside every live fragment and the kernel
                # spills; the loop is bound by its stores anyway.
                self.w.line("#pragma unroll 1")
                with self.w.block(f"for (int el = lane; el < {TILE_ELEMS}; el += 32)"):
                    self.read_out(op, chain)
                self.w.line("__syncwarp();")

    def fused_chain(self) -> list[tuple[Compute, dict[LoopVar, str]]]:
        """The epilogue stages to apply in this store, taken from the printer's pending list."""
        chain, self.chain = self.chain, []
        if any(depth != self.w.depth for _, _, depth in chain):
            raise Unsupported(
                "an epilogue stage in another loop than the store of its chain",
                "the fused store applies the stages where it reads the accumulators back",
            )
        return [(stage, env) for stage, env, _ in chain]

    def read_out(self, op: WriteTiles, chain: list[tuple[Compute, dict[LoopVar, str]]]) -> None:
        """One element of the scratch tile, through the epilogue chain, to the output.

        Lane `el` holds page tile (bh, bw)'s element at row el / 16 and column el % 16; only the bias needs the
        column. Each stage's statement is its op's image and carries its census marker.
        """
        out = f"t{int(op.tensor)}[tile * {TILE_ELEMS} + el]"
        if not chain:
            self.w.line(f"{out} = (OUT_T)scratch[el];")
            return
        self.w.line(f"{'long long' if self.k.integer else 'float'} v = scratch[el];")
        for stage, env in chain:
            self.w.line(epilogue.statement(stage.op, self.k.integer, self.bias_at(stage.op, env)), marker(stage))
        self.w.line(f"{out} = (OUT_T)v;")

    def bias_at(self, stage: ComputeOp, env: dict[LoopVar, str]) -> str:
        """The flat index of the element's bias: tile column `at + s mod width` of page tile s, row 0, column el % 16.

        The page is the item's h x w tiles in row-major order, so page tile s = bh * w + bw.
        """
        if not isinstance(stage, Bias):
            return ""
        w = self.k.item_tiles[1]
        s = "bw" if stage.width == w else (_mod(f"(bh * {w} + bw)", stage.width) or "0")
        at = addr_expr(stage.at, env)
        return f"(long long)({_sum(at if at != '0' else '', s)}) * {TILE_ELEMS} + el % 16"


# ---- the kernel text ---------------------------------------------------------------------------------------


def preamble(k: Kernel) -> list[str]:
    """Includes, the ABI's macros, type and size definitions, and the work list (docs/kernel-abi.md)."""
    p = k.program
    lines = [f"// {p.name}: a persistent CUDA kernel printed by spatialc from the spatial IR; each block is one site."]
    lines += [f"#include <{h}>" for h in INCLUDES]
    lines += ["", RING_MACROS, CHECK_MACRO, ""]
    lines += [f"typedef {k.types.operand} OPT;", f"typedef {k.types.acc} ACCT;", f"typedef {k.out_type} OUT_T;"]
    if k.has_epilogue:
        lines += ["", *epilogue.helpers().rstrip("\n").split("\n"), ""]
    lines += [f"#define NTHREAD {k.lanes * 32}", f"#define NWARP {k.lanes}", f"#define PERW {k.perw}"]
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        lines += [f"#define DEPTH_{rid} {ring.depth}", f"#define PAGE_{rid} {ring.page}"]
    if k.smem.epi_off is not None:
        lines.append(f"#define SMEM_OFF_EPI {k.smem.epi_off}")
    lines += [f"#define SMEM_OFF_{rid} {off}" for rid, off in sorted(k.smem.ring_off.items())]
    if k.smem.dyn_bytes:
        lines.append(f"#define DYN_SMEM {k.smem.dyn_bytes}")
    return lines + [""]


def kernel_text(k: Kernel, ops: tuple[SerialOp, ...]) -> str:
    """The kernel source (`kernel_cu`): preamble, work list and the `__global__` function, no host code."""
    w = Writer()
    for line in preamble(k):
        w.line(line)
    params = ", ".join(
        [
            f"{'OUT_T' if t.role == TensorRole.OUTPUT else 'const ' + ty}* __restrict__ t{int(t.id)}"
            for t, ty in zip(k.program.tensors, k.param_types, strict=True)
        ]
        + ["const int* __restrict__ spatialc_work"]
    )
    # extern "C": the symbol in the module is KERNEL_NAME itself, the name launch.json gives (not a C++ mangling).
    w.line(f'extern "C" __global__ __launch_bounds__(NTHREAD, {k.blocks_per_sm}) void {KERNEL_NAME}({params})')
    with w.block():
        kernel_prologue(k, w)
        env: dict[LoopVar, str] = {}
        if not any(isinstance(op, SerialLoop) and op.var == LV_ITEM for op in ops):
            # No ITEM loop (no site holds two items): the site's one item is implicit.
            OpPrinter(k, w).item_header("ITEM_LIST[item_off]")
            env = {LV_ITEM_Y: "item_y", LV_ITEM_X: "item_x"}
        OpPrinter(k, w, barrier_free_pops(k.rings, ops)).ops(ops, env)
    return w.text()


def kernel_prologue(k: Kernel, w: Writer) -> None:
    """Thread coordinates, the site's slice of the work list, rings, counters and accumulators."""
    w.line("const int tid = threadIdx.x;")
    w.line("const int warp = tid / 32;")
    w.line("const int site = blockIdx.x;")
    # The work list is an argument, built at launch for the sites the device has (docs/kernel-abi.md): each site's
    # offset into the item list, then each site's count, then the items.
    w.line("const int item_off = spatialc_work[site];")
    w.line("const int n_items = spatialc_work[gridDim.x + site];")
    w.line("const int* ITEM_LIST = spatialc_work + 2 * gridDim.x;")
    w.line("if (n_items == 0) { return; }")
    if k.smem.dyn_bytes:
        w.line("extern __shared__ __align__(32) char spatialc_dyn_smem[];")
    for rid in sorted(k.rings.rings):
        ring = k.rings.rings[rid]
        if k.smem.rings_dynamic:
            w.line(
                f"SPATIALC_DYNAMIC_RING({ring.c_type}, ring_{rid}, spatialc_dyn_smem, SMEM_OFF_{rid}, DEPTH_{rid}, "
                f"PAGE_{rid});"
            )
        else:
            w.line(f"SPATIALC_SHARED_RING({ring.c_type}, ring_{rid}, DEPTH_{rid}, PAGE_{rid});")
        # wslot names the page the last Reserve claimed (so it starts one before slot 0); rslot the front page.
        w.line(f"int wslot_{rid} = DEPTH_{rid} - 1, rslot_{rid} = 0;")
    if k.smem.epi_off is not None:
        w.line(f"SPATIALC_DYNAMIC_RING(ACCT, epi_scratch, spatialc_dyn_smem, SMEM_OFF_EPI, NWARP, {TILE_ELEMS});")
    w.line(f"{WMMA}fragment<{WMMA}accumulator, 16, 16, 16, ACCT> accf[PERW];")
