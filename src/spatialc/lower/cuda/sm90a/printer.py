"""The sm_90a form's engine printer: the general form's, with operand pages loaded by the copy engine (TMA boxes
announced on the full barrier with the producer's arrival), multiplied by wgmma from shared-memory descriptors, a K
loop that keeps one wgmma group in flight, and the consumers' fused store through staging boxes and TMA stores.
`kernel.py` describes the kernel; `text.py` prints the rest of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ....ir.ids import LoopVar, loop_var_name
from ....ir.names import plain
from ....ir.ops import (
    AddPartial,
    ChoreoOp,
    Compute,
    Loop,
    MatmulTiles,
    PackAcc,
    Pop,
    Precision,
    Push,
    ReadBarrier,
    ReadTiles,
    Reserve,
    SemInc,
    SemSet,
    SemWait,
    Trip,
    Wait,
    WriteBarrier,
    WriteTiles,
)
from ....ir.printer import compute_text
from ....passes.footprint import operand_layouts, sized_as
from ...census import POST, marker
from ...errors import Unsupported
from ..common.blockscale import promoted_fmas, promotion, scale_loads
from ..common.clusters import ClusterPrinter
from ..common.cwriter import Writer, addr_expr, c_div, c_mod, c_mul, c_sum
from ..common.rings import TILE_ELEMS, Ring
from ..general import kernel as general
from ..general import printer as general_printer
from . import staging
from .partials import PartialSide
from .plan import OUT_BYTES, STORE_BUFFERS, SWIZZLED, WARPGROUP
from .tma import Panels, TileBoxes, param_at

if TYPE_CHECKING:
    from .kernel import HopperKernel

DESC_SWIZZLE = {128: 1, 64: 2, 32: 3}  # a matrix descriptor's swizzle mode, by the panels' width in bytes
ACC_FENCE = "spatialc_acc_fence(accf);"  # the accumulators' registers pinned there (sm90a.cuh)


class HopperPrinter(ClusterPrinter, general_printer.EnginePrinter):
    """The general form's engine printer, with operand pages loaded by the copy engine and multiplied by wgmma."""

    counts_sends = False  # a multicast page lands at the sender's own stage in every block

    def __init__(self, hk: HopperKernel, role: general.Role, w: Writer):
        super().__init__(hk.base, role, w)
        self.hk = hk
        self.sends: frozenset[int] = frozenset()  # rings the program being printed multicasts
        self.deferred: dict[int, tuple[ChoreoOp, dict[LoopVar, str]]] = {}  # a sender's loads, issued at the send
        self.in_flight = False  # a wgmma group issued and not yet waited for (printing order is program order)
        self.integer = hk.base.integer
        self.chain: list[tuple[Compute, dict[LoopVar, str]]] = []  # epilogue stages met since the last store
        self.arrived: set[int] = set()  # rings whose next Push already arrived, with its load's expect_tx
        self.promoted_later = False  # a block-scaled step's promotion printed after its releases (`k_loop_promoted`)
        self.partials: PartialSide | None = None  # the site class's split-K partial sums (partials.py), if any
        self.partials_added = 0  # AddPartials printed so far in the class's program

    def read_slot(self, r: int) -> str:
        """The front page: the slot of the engine's last Wait (its release may come a step later)."""
        if any(isinstance(op, Wait) and self.k.rings.template[op.buf] == r for op in self.role.walk()):
            return f"((wt_{r} - 1) % DEPTH_{r})"
        return super().read_slot(r)

    def op(self, op: ChoreoOp, env: dict[LoopVar, str]) -> None:
        mark = marker(op)
        rings = self.k.rings
        match op:
            case Pop() | PackAcc() if self.in_flight:
                # The slot (or the accumulators) stay the MMA's until its group has retired.
                self.w.line("spatialc_wgmma_wait<0>();  // the K step's wgmma have read the stage")
                self.w.line(ACC_FENCE + "  // and written the accumulators: nothing reads them before")
                self.in_flight = False
                self.op(op, env)
            case _ if rings.direct and self.partial_sums(op, env, mark):
                pass
            case Push(buf) if rings.is_fused(buf) and rings.chain_step(buf) == len(rings.fused) - 1:
                # The last page of the chain is the one the writer would store: the consumers store it themselves.
                assert self.hk.store is not None
                chain, self.chain = self.chain, []
                self.fused_store(self.hk.store, env, marker(self.hk.store), chain)
                self.w.line("", f"{mark} (fused output: no ring)")
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) | PackAcc(to=buf) if rings.is_fused(buf):
                self.w.line("", f"{mark} (fused output: no ring)")
            case Compute(op=stage, ins=(buf, *_)) if rings.is_fused(buf):
                # (a residual's page beside it is read in the fused store, between its ring's Wait and Pop)
                self.w.line(f"// {plain(compute_text(stage, self.k.program))}: applied in the fused store below")
                self.chain.append((op, env))
            case WriteTiles(src=buf) if rings.is_fused(buf):
                pass  # its image, with its census marker, is the consumers' fused store
            case Loop() if self.scaled_k_loop(op):
                self.k_loop_promoted(op, env, mark)
            case Loop() if self.pipelined(op):
                self.k_loop_pipelined(op, env, mark)
            case ReadTiles(into=buf) if self.kept(buf).id in self.sends:
                # The sender's page goes to every block of its group at once: loaded where the IR sends it.
                self.deferred[self.kept(buf).id] = (op, env)
                self.w.line("", f"{mark} (loaded into the group's blocks by the multicast below)")
            case ReadTiles(into=buf) if self.kept(buf).id in self.hk.tma_rings:
                self.tma(op, env, mark)
            case ReadBarrier() if self.role.first_warp >= self.hk.wg.consumers * WARPGROUP:
                self.w.line("", f"{mark} (no cp.async: the copy engine's bytes count on the full barrier)")
            case _ if self.handshake(op, env, mark):
                pass
            case Pop(buf) if self.kept(buf).id in self.hk.warp_freed:
                self.release(op, mark)
            case Push(buf) if self.kept(buf).id in self.arrived:
                r = self.kept(buf).id
                self.arrived.discard(r)
                self.w.line(f"++psh_{r};", f"{mark} (its arrival went with the expect_tx above)")
            case Push(buf) if self.kept(buf).id in self.hk.tma_rings:
                r = self.kept(buf).id
                self.w.line(f"spatialc_mbar_arrive(&full_{r}[psh_{r} % DEPTH_{r}]); ++psh_{r};", mark)
            case Compute(op=MatmulTiles() as mm, ins=(a, b)):
                self.wgmma(mm, self.kept(a), self.kept(b), mark, env)
            case _:
                super().op(op, env)

    def partial_sums(self, op: ChoreoOp, env: dict[LoopVar, str], mark: str) -> bool:
        """Print `op` if it moves split-K's partial sums, whose rings have no pages here (partials.py), and say
        whether it did: a contributor's consumers store their elements, fence, and raise the owner's semaphore (the
        writer's ops, printed here with their markers); an owner's wait for the semaphore before their first add
        (the reader's), and each add from the workspace block the reader's read of that page names."""
        rings, side = self.k.rings, self.partials
        match op:
            case PackAcc(to=buf) if rings.is_direct(buf):
                assert side is not None and side.store is not None and side.inc is not None
                self.w.line("// the partial sums go to the workspace from the accumulators", mark)
                self.direct_partials(side.store, env, marker(side.store))
                self.w.line("__threadfence();  // visible at device scope before the raise", marker(WriteBarrier()))
                self.handover(side.inc, marker(side.inc))
            case Wait(buf) if rings.is_direct(buf) and side is not None and side.wait is not None:
                if self.partials_added == 0:  # the reader's wait: every contributor has raised the semaphore
                    self.handover(side.wait, marker(side.wait))
                self.w.line("", f"{mark} (partial sums: no ring)")
            case Compute(op=AddPartial(), ins=(buf,)) if rings.is_direct(buf):
                assert side is not None
                read = side.reads[self.partials_added]  # the ring's j-th page is the reader's j-th read
                self.w.line("// a contributor's partial sums, added from the workspace", mark)
                self.direct_partials(read, env, marker(read))
                self.partials_added += 1
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) if rings.is_direct(buf):
                self.w.line("", f"{mark} (partial sums: no ring)")
            case ReadTiles(into=buf) if rings.is_direct(buf):
                pass  # its image, with its marker, is the consumers' add (partial_sums' AddPartial)
            case WriteTiles(src=buf) if rings.is_direct(buf):
                pass  # its image, with its marker, is the consumers' store (partial_sums' PackAcc)
            case SemWait() if side is not None and side.wait is op:
                pass  # the consumers wait, before their first add
            case WriteBarrier() | SemInc() if side is not None and side.store is not None and self.role.first_warp:
                pass  # the consumers fence and raise, after their store
            case _:
                return False
        return True

    def pipelined(self, loop: Loop) -> bool:
        """Whether `loop` is a K loop whose releases can wait a step: its body waits, multiplies once and pops exactly
        the matmul's rings, each at least two pages deep, and its count is fixed."""
        if isinstance(loop.count, Trip) or loop.count.n < 1:  # type: ignore[union-attr]
            return False
        body = loop.body
        mms = [i for i, op in enumerate(body) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles)]
        if len(mms) != 1:
            return False
        if body[mms[0]].op.scales is not None:  # type: ignore[union-attr]  # its step's group retires in the step
            return False
        at = mms[0]
        waits, pops = body[:at], body[at + 1 :]
        mm = body[at]
        assert isinstance(mm, Compute)
        if not all(isinstance(o, Wait) for o in waits) or not all(isinstance(o, Pop) for o in pops):
            return False
        rings = {self.kept(b).id for b in mm.ins}
        popped = [self.kept(o.buf).id for o in pops]  # type: ignore[union-attr]
        return sorted(popped) == sorted(rings) and all(self.kept(b).depth >= 2 for b in mm.ins)

    def scaled_k_loop(self, loop: Loop) -> bool:
        """Whether `loop` is a block-scaled K loop: its body waits, multiplies once with scales and pops exactly
        the matmul's rings."""
        body = loop.body
        mms = [op for op in body if isinstance(op, Compute) and isinstance(op.op, MatmulTiles)]
        if len(mms) != 1 or mms[0].op.scales is None:  # type: ignore[union-attr]
            return False
        at = body.index(mms[0])
        waits, pops = body[:at], body[at + 1 :]
        if not all(isinstance(o, Wait) for o in waits) or not all(isinstance(o, Pop) for o in pops):
            return False
        return sorted(self.kept(o.buf).id for o in pops) == sorted(self.kept(b).id for b in mms[0].ins)  # type: ignore[union-attr]

    def k_loop_promoted(self, loop: Loop, env: dict[LoopVar, str], mark: str) -> None:
        """A block-scaled K loop as DeepGEMM's: a step reads its scales (A's from the stage that came with A's page,
        B's from global memory) before it issues its wgmma, so their latency passes under them; waits for its
        group; releases its stages at once — nothing reads them after — and then promotes (`k_loop`'s steps)."""
        v = loop_var_name(loop.var)
        at = next(i for i, op in enumerate(loop.body) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles))
        waits, mm, pops = loop.body[:at], loop.body[at], loop.body[at + 1 :]  # waits: a W4A16 step's dequant too
        assert isinstance(mm, Compute) and isinstance(mm.op, MatmulTiles) and mm.op.scales is not None
        with self.w.block(f"for (int {v} = 0; {v} < {loop.count.n}; ++{v})", mark):  # type: ignore[union-attr]
            inner = env | {loop.var: v}
            for op in waits:
                self.op(op, inner)
            counts = scale_loads(self, mm.op.scales, inner, self.a_scale())
            self.promoted_later = True
            self.op(mm, inner)
            self.promoted_later = False
            for op in pops:
                self.op(op, inner)
            with self.w.block("", "// the promotion, its stages released"):
                promoted_fmas(self, counts)

    def a_scale(self) -> Callable[[str], str] | None:
        """A's scale of a row where the producer landed them beside A's page (`sa_stage`), from the slot A's page is
        read from; None where the promotion reads them from global memory."""
        sa = self.hk.scales
        if sa is None:
            return None
        slot = self.read_slot(sa.ring)
        return lambda row: f"sa_stage[{slot} * {sa.rows} + {row} - sr0]"

    def k_loop_pipelined(self, loop: Loop, env: dict[LoopVar, str], mark: str) -> None:
        """The K loop with each step's releases printed one step late (one wgmma group in flight)."""
        v = loop_var_name(loop.var)
        at = next(i for i, op in enumerate(loop.body) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles))
        waits, mm, pops = loop.body[:at], loop.body[at], loop.body[at + 1 :]  # waits: a W4A16 step's dequant too
        with self.w.block(f"for (int {v} = 0; {v} < {loop.count.n}; ++{v})", mark):  # type: ignore[union-attr]
            inner = env | {loop.var: v}
            for op in waits:
                self.op(op, inner)
            self.op(mm, inner)
            self.w.line("spatialc_wgmma_wait<1>();  // the previous K step's group has retired; this one runs on")
            self.in_flight = False
            with self.w.block(f"if ({v} > 0)", "// the previous K step's stages go back to the producer"):
                for op in pops:
                    self.release(op, marker(op))
        self.w.line("spatialc_wgmma_wait<0>();  // the last K step's group")
        self.w.line(ACC_FENCE + "  // the accumulators are whole: nothing reads them before")
        for op in pops:
            self.release(op, marker(op, POST))

    def fused_store(
        self, op: WriteTiles, env: dict[LoopVar, str], mark: str, chain: list[tuple[Compute, dict[LoopVar, str]]]
    ) -> None:
        """The fused store through shared memory: each consumer warp takes `chunk` tiles of its row at a time
        through the chain into one of its STORE_BUFFERS staging boxes, in turn (the tiles one after another, each
        row-major: the output map's box), fences them over to the async proxy, and its first lane stores them by
        TMA, a tile a box, as one bulk group. A box is written again only once the group that last read it has
        (`bulk_wait_read<STORE_BUFFERS - 1>`: the groups after it may still be reading the other box) — across
        items too, so the item's last stores go on while the next item's K loop runs; the engine waits for the
        last of them before it ends (`_engine`)."""
        chunk = self.hk.chunk
        if not chunk:
            super().fused_store(op, env, mark, chain)
            return
        if self.hk.epilogue == SWIZZLED:
            staging.swizzled_store(self, op, env, mark, chain)
            return
        cols = self.k.program.tensor(op.tensor).tiles[1]
        m = self.hk.maps[-1]
        with self.w.block("", mark):
            self.warp_coords()
            self.w.line("const int lane = tid % 32;")
            matrix = OUT_BYTES[self.k.out_type] == 2  # 16-bit values go out by stmatrix, a tile a warp at once
            if chain or not matrix:
                self.w.line("const int lane_el = (lane >> 2) * 16 + 2 * (lane & 3);  // the lane's first element")
            base = addr_expr(op.at, env)
            with self.unrolled("for (int q0 = 0; q0 < PERW; q0 += OUT_CHUNK)"):
                # An item of a whole number of turns starts on the first box: the box is known where printed.
                turn = "q0 / OUT_CHUNK" if not self.hk.odd_turns else "boxes_out"
                self.w.line(
                    f"OUT_T* const staged = out_stage + (warp * {STORE_BUFFERS} + ({turn}) % {STORE_BUFFERS}) * "
                    f"(OUT_CHUNK * {TILE_ELEMS});  // this warp's box in turn"
                )
                wait = f"spatialc_bulk_wait_read<{STORE_BUFFERS - 1}>();"
                self.w.line(f"if (lane == 0) {{ {wait} }}  // the store that last read this box has read it")
                self.w.line("__syncwarp();")
                with self.unrolled("for (int c = 0; c < OUT_CHUNK; ++c)"):
                    self.w.line("const int q = q0 + c;")
                    if matrix:
                        self.w.line("OUT_T out[8];")
                    value = "accf[q].x[i]"
                    if chain:  # one element at a time, as the direct fused store does (registers)
                        self.w.line(self.owned_tile() + "  // (a bias reads its column)")
                        self.w.line("(void)bh; (void)bw;")
                        self.w.line("ACCT frag[8];")
                        with self.unrolled("for (int i = 0; i < 8; ++i)"):
                            self.w.line("frag[i] = accf[q].x[i];")
                        self.w.line("#pragma unroll 1")
                        value = "frag[i]"
                    with (
                        self.w.block("for (int i = 0; i < 8; ++i)")
                        if chain
                        else self.unrolled("for (int i = 0; i < 8; ++i)")
                    ):
                        if chain or not matrix:  # (a bias reads the element's column)
                            self.w.line("const int el = lane_el + ((i >> 1) & 1) * 128 + (i >> 2) * 8 + (i & 1);")
                        if matrix:
                            if chain:
                                self.w.line("(void)el;")
                            self.read_out(op, chain, value, "out[i] = {};")
                        else:
                            self.read_out(op, chain, value, f"SPATIALC_PAGE_ST(staged + c * {TILE_ELEMS} + el, {{}});")
                    if matrix:
                        self.w.line(f"spatialc_stmatrix_tile(staged + c * {TILE_ELEMS}, out);")
                self.w.line("spatialc_fence_proxy_async();  // the lane's staged values, visible to the copy engine")
                self.w.line("__syncwarp();")
                with self.w.block("if (lane == 0)", "// a box a tile: the warp's tile row, tile columns q0 …"):
                    rows, cols_at = c_mul("(long long)wi", op.stride_h), c_mul("(long long)q0", op.stride_w)
                    self.w.line(f"const long long tile = {c_sum(f'(long long)({base})', rows, cols_at)};")
                    self.w.line(f"const int row = (int)(tile / {cols}) * 16, col = (int)(tile % {cols}) * 16;")
                    with self.unrolled("for (int c = 0; c < OUT_CHUNK; ++c)"):
                        at = f"col + c * 16, row, staged + c * {TILE_ELEMS}"
                        self.w.line(f"spatialc_tma_store_2d(&spatialc_tmap_{m.index}, {at});")
                    self.w.line("spatialc_bulk_commit();")
                if self.hk.odd_turns:
                    self.w.line("++boxes_out;")

    def full_wait(self, r: int) -> str:
        # A multicast ring's page may come from a peer, whose bytes complete the barrier at cluster scope.
        if self.hk.multicast is not None and r in self.hk.multicast.rings:
            return "spatialc_mbar_wait_cluster"
        return super().full_wait(r)

    def reset(self, op: SemSet, before: ChoreoOp | None) -> None:
        if not self.handshake_reset(op):
            super().reset(op, before)

    def release(self, op: ChoreoOp, mark: str) -> None:
        """A Pop: where only wgmma reads the stage (`warp_freed`), one arrival of the warp on the slot's empty
        barrier — the wait_group that retired the wgmma reading it is warp-synchronous (.sync.aligned): when lane 0
        is past it, so is every lane; otherwise one arrival a thread."""
        assert isinstance(op, Pop)
        r = self.kept(op.buf).id
        if r not in self.hk.warp_freed:
            self.w.line(f"spatialc_mbar_arrive(&empty_{r}[pop_{r} % DEPTH_{r}]); ++pop_{r};", mark)
            return
        with self.w.block("if ((threadIdx.x & 31) == 0)", "// one arrival a warp (EMPTY_COUNT: the consumer warps)"):
            self.w.line(f"spatialc_mbar_arrive(&empty_{r}[pop_{r} % DEPTH_{r}]);", mark)
        self.w.line(f"++pop_{r};")

    def expect_bytes(self, r: int, slot: str, nbytes: int, pushed: bool) -> None:
        """A page's bytes announced on its slot's full barrier; where the ring's Push follows the load at once, with
        that Push's arrival in the same instruction (the Push then prints nothing)."""
        if pushed:
            self.w.line(f"spatialc_mbar_arrive_expect_tx(&full_{r}[{slot}], {nbytes}u);  // and the Push below")
            self.arrived.add(r)
        else:
            self.w.line(f"spatialc_mbar_expect_tx(&full_{r}[{slot}], {nbytes}u);")

    def tma(self, op: ReadTiles, env: dict[LoopVar, str], mark: str, mask: str | None = None) -> None:
        """The whole page's bytes announced on the slot's full barrier, then one box a panel — multicast to the
        blocks of `mask` where one is given."""
        t = self.k.program.tensor(op.tensor)
        ring = self.kept(op.into)
        r = ring.id
        pan = self.hk.panels[r]
        at = param_at(self.k.program, op.tensor)
        m = next(m for m in self.hk.maps if (m.tensor, m.box, m.swizzle) == (at, pan.box, pan.width))
        assert op.block_h * op.block_w * TILE_ELEMS == ring.page, "a page is one ReadTiles (tma.tensor_maps)"
        nbytes = self.page_bytes(r)
        sa = self.hk.scales if self.hk.scales is not None and self.hk.scales.ring == r else None
        slot = self.write_slot(r)
        # A load its ring's Push follows at once makes that Push's arrival with its expect_tx, in one instruction.
        pushed = mask is None and isinstance(self.after, Push) and self.kept(self.after.buf).id == r
        with self.w.block("", mark):
            self.w.line(f"const int at = {addr_expr(op.at, env)};  // the page's first tile of {plain(t.name)}")
            self.expect_bytes(r, slot, nbytes, pushed)
            row, col = f"(at / {t.tiles[1]}) * 16", f"(at % {t.tiles[1]}) * 16"
            if isinstance(pan, TileBoxes):
                assert mask is None, "a residual's page is not multicast"
                self.tile_boxes(pan, m.index, f"(char*)({self.write_page(r)})", row, col, f"&full_{r}[{slot}]")
                return
            inner, outer = (row, col) if pan.transposed else (col, row)  # the stored matrix's column, row
            page, bar = f"(char*)({self.write_page(r)})", f"&full_{r}[{slot}]"
            if mask is not None:
                self.w.line(f"const unsigned short group = {mask};")
            if sa is not None:  # the box of the page's K group (its first column's) of A's scales: the item's rows
                k_group = f"((at % {t.tiles[1]}) * 16) / {sa.k}"
                load = f"sa_stage + {slot} * {sa.rows}, &spatialc_tmap_{sa.map.index}, {row}, {k_group}, {bar}"
                if mask is None:
                    self.w.line(f"spatialc_tma_load_2d({load});")
                else:  # to the group's blocks, whose items share these rows, as A's page
                    self.w.line(f"spatialc_tma_load_2d_multicast({load}, group);")
            for i in range(pan.count):
                dst = f"{page} + {i * pan.bytes}" if i else page
                c0 = f"{inner} + {i * pan.box[1]}" if i else inner
                if mask is None:
                    self.w.line(f"spatialc_tma_load_2d({dst}, &spatialc_tmap_{m.index}, {c0}, {outer}, {bar});")
                else:
                    load = (
                        f"spatialc_tma_load_2d_multicast({dst}, &spatialc_tmap_{m.index}, {c0}, {outer}, {bar}, group);"
                    )
                    self.w.line(load)

    def page_bytes(self, r: int) -> int:
        """The bytes a page of ring `r` brings to its full barrier: the page's, and for A's ring of a block-scaled
        GEMM the box of its K group's scales (`blockscale.ScaleStage`)."""
        ring = self.k.rings.rings[r]
        sa = self.hk.scales
        return ring.page * ring.elem_bytes + (sa.bytes if sa is not None and sa.ring == r else 0)

    def tile_boxes(self, boxes: TileBoxes, index: int, page: str, row: str, col: str, bar: str) -> None:
        """A page of whole tiles, one unswizzled 16 x 16 box a tile: page tile s (row s / block_w, column s % block_w
        of the block at tile row `row`, column `col` of the stored matrix) at byte s * box bytes of the page."""
        with self.w.block(f"for (int s = 0; s < {boxes.count}; ++s)", "// a box a tile, in the page's tile order"):
            across, down = c_mod("s", boxes.block_w), c_div("s", boxes.block_w)
            c0 = c_sum(col, f"({across}) * 16" if across else "")
            c1 = c_sum(row, f"({down}) * 16")
            self.w.line(f"spatialc_tma_load_2d({page} + s * {boxes.bytes}, &spatialc_tmap_{index}, {c0}, {c1}, {bar});")

    def wgmma(self, mm: MatmulTiles, a: Ring, b: Ring, mark: str, env: dict[LoopVar, str]) -> None:
        """One K step: a wgmma per 16 (8-bit: 32) K elements — 32 bytes of K — each warpgroup's 64 rows of A and the
        whole B page read from shared memory through descriptors, committed as one group. A (and 8-bit B) K-major:
        an instruction's K is 32 bytes of a panel row, the next 8 rows a panel row × 8 on; 16-bit B N-major: its
        16 K rows are panel rows, the next 8 K rows 8 panel rows on, the next panel of N columns a panel on."""
        check_page_layouts(mm.operand, a, b)
        ibw = mm.block.ibw
        step = 2 if sized_as(mm.operand) == Precision.INT8 else 1  # tiles of K an instruction takes: 32 bytes
        pa, pb = self.hk.panels[a.id], self.hk.panels[b.id]
        kb = "(kk * 16 * (int)sizeof(OPT))"  # the instruction's first byte of K

        def k_major(page: str, pan: Panels, first_row: str) -> str:
            at = f"{page} + ({kb} / {pan.width}) * {pan.bytes} + {first_row} * {pan.width} + {kb} % {pan.width}"
            return f"spatialc_wgmma_desc({at}, 16u, {8 * pan.width}u, {DESC_SWIZZLE[pan.width]}u)"

        a_page, b_page = f"(const char*)({self.read_page(a.id)})", f"(const char*)({self.read_page(b.id)})"
        a_of = k_major(a_page, pa, f"(warp / {WARPGROUP}) * 64")  # the warpgroup's 64 rows
        if pb.transposed:  # 8-bit B: its rows are N, K-major like A
            b_of = k_major(b_page, pb, "0")
        else:
            at = f"{b_page} + kk * 16 * {pb.width}"
            b_of = f"spatialc_wgmma_desc({at}, {pb.bytes}u, {8 * pb.width}u, {DESC_SWIZZLE[pb.width]}u)"
        if mm.scales is not None:
            self.promoted_wgmma(mm, a_of, b_of, mark, env)
            return
        with self.w.block("", mark):
            self.w.line(ACC_FENCE + "  // their last plain writes (the zeroing) stay before the fence")
            self.w.line("spatialc_wgmma_fence();  // the accumulators were last written by plain instructions")
            with self.unrolled(f"for (int kk = 0; kk < {ibw}; kk += {step})"):
                self.w.line(f"spatialc_wgmma<{self.hk.n}, OPT>(accf, {a_of}, {b_of});")
            self.w.line("spatialc_wgmma_commit();")
        self.in_flight = True

    def promoted_wgmma(self, mm: MatmulTiles, a_of: str, b_of: str, mark: str, env: dict[LoopVar, str]) -> None:
        """A block-scaled K step (one K group: numerics/blockscale.py), DeepGEMM's: its wgmma into the partial
        accumulators `part`, the first with scale-d 0 (D = A · B: fresh for the group, no zeroing instructions),
        committed and waited for, then promoted into `accf` by the forms' one promotion printer — an fmaf an element
        with sa · sb. The promotion needs the group retired, so no group stays in flight across steps; the other
        consumer warpgroup's wgmma (and the other block's, paired) keep the tensor cores busy meanwhile."""
        with self.w.block("", mark):
            self.w.line("spatialc_acc_fence(part);  // the last promotion's reads of them stay before the fence")
            self.w.line("spatialc_wgmma_fence();  // the partials were last read by plain instructions")
            with self.unrolled(f"for (int kk = 0; kk < {mm.block.ibw}; kk += 2)"):
                self.w.line(f"spatialc_wgmma_sd<{self.hk.n}, OPT>(part, {a_of}, {b_of}, kk > 0);")
            self.w.line("spatialc_wgmma_commit();")
            self.w.line("spatialc_wgmma_wait<0>();  // the group's partial sums are whole")
            self.w.line("spatialc_acc_fence(part);  // and nothing reads them before")
            assert mm.scales is not None
            if not self.promoted_later:  # (a K loop of another shape: promoted here, its stages released after)
                with self.w.block(""):
                    promotion(self, mm.scales, env, self.a_scale())


def check_page_layouts(operand: Precision, a: Ring, b: Ring) -> None:
    """Refuse operand pages the descriptors cannot describe: swizzled panels, 8-bit B transposed."""
    want = operand_layouts(operand, "sm90a")
    for ring, layout, what in ((a, want[0], "A"), (b, want[1], "B")):
        if ring.layout != layout:
            raise Unsupported(
                f"{operand.value} operand {what} in {ring.layout.value} pages ({ring.name})",
                f"the sm_90a form's wgmma reads {what} from {layout.value} pages; build the program for sm_90a",
            )
