"""The register path: rings of the compute engine's own kept in its registers, not in shared memory — attention's
recurrence as FlashAttention-2 holds it (docs/kernel-abi.md, "The general form", the register path).

A ring lives in registers when (`register_rings`) the compute engine alone pushes and pops it, it is one page deep
(rule 7's order then has each page made and used up in the engine's program order, which its warps keep without a
barrier), and every op that writes or reads its page touches, in each warp, exactly the rows that warp computes: the
compute warps lie over every accumulator's block by rows alone (lane grid (NWARP, 1)), the page's writer is a
PackAcc of fragments or of a row accumulator, or a map of such pages, and its readers maps, a RowReduce, a ScaleAcc
or the A operand of a matmul. All of a program's candidates qualify, or none does: the kernel then keeps every page.

A register ring of fragments holds, for each of the warp's tiles, the eight values of a lane's mma accumulator
fragment (`spatialc_acc`, `rr_<ring>[q * 8 + e]`): element e of fragment q in row g + 8·((e / 2) mod 2) and column
2t + (e mod 2) + 8·(e / 4) of its tile, g = lane / 4, t = lane mod 4. Packed two by two they are the A fragment of
mma.m16n8k16 (`spatialc_load_a_acc`): P's registers are P·V's operand. A register row vector holds the lane's rows
(`rr_<ring>[s]`, s = 2·(the warp's tile row) + (the upper eight rows)), the value of the row as the four lanes of the
lane's quad combined it. Row accumulators are then held in the same layout (`RowAccumulators.per_warp` two rows for
each of the warp's tile rows: the lane's shares of them), folded lane by lane and combined by two shuffles at each
PackAcc, which leaves the shares as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ....ir.ids import BufferId, LoopVar
from ....ir.ops import (
    ChoreoOp,
    Compute,
    Map,
    MatmulTiles,
    McastSend,
    PackAcc,
    Pop,
    Pos,
    Push,
    ReadTiles,
    Reserve,
    RowReduce,
    ScaleAcc,
    VecAxis,
    Wait,
    WriteTiles,
)
from ....ir.ops import cols as expr_cols
from ....ir.printer import compute_text
from ...errors import Unsupported
from . import epilogue
from .cwriter import Writer, addr_expr
from .maps import position_nodes
from .rings import TILE_ELEMS, Ring, Rings
from .rows import FULL_MASK
from .tiles import Fragments

QUAD_XOR = (1, 2)  # the lanes of a quad (one row of an mma fragment) combined: lane ^ 1, then lane ^ 2


def register_rings(
    ops: list[ChoreoOp], rings: Rings, depth: dict[int, int], rows: frozenset[int], layers: dict[int, Fragments]
) -> dict[int, int | None]:
    """The rings (by template) the compute engine's program `ops` may keep in registers, each with what it holds: the
    fragments of accumulator layer t (t), or a row vector (None) — {} unless every candidate qualifies (module
    docstring). `rows` are the row accumulators' templates, `layers` the fragment accumulators' (each laid over its
    block by rows alone: the caller's to ensure)."""
    t = rings.template
    pushed = {t[op.buf] for op in ops if isinstance(op, Push)}
    popped = {t[op.buf] for op in ops if isinstance(op, Pop)}
    candidates = {r for r in pushed & popped if depth.get(r) == 1}
    kind: dict[int, int | None] = {}
    for op in ops:
        match op:
            case PackAcc(acc=acc, to=to) if t[to] in candidates:
                a = t[acc]
                if a not in rows and a not in layers:
                    return {}
                kind.setdefault(t[to], None if a in rows else a)
            case Compute(op=Map() as m, ins=ins, outs=(dst,)) if any(t[b] in candidates for b in (*ins, dst)):
                if any(t[b] not in kind for b in ins) or expr_cols(m.expr):
                    return {}  # every input of a map that touches a register ring is one, already written
                held = [kind[t[b]] for b in ins if kind[t[b]] is not None]
                if len(set(held)) > 1 or (not held and position_nodes(m.expr)):
                    return {}  # fragments of one layout; a map of row vectors alone places no element
                if t[dst] in candidates:
                    kind.setdefault(t[dst], held[0] if held else None)
            case Compute(op=RowReduce() as red, ins=(src,)) if t[src] in candidates:
                layer = kind.get(t[src])
                if layer is None or layers[layer].plan.block.osw != red.width:
                    return {}
            case Compute(op=ScaleAcc(), ins=(src,)) if t[src] in candidates:
                if t[src] not in kind or kind[t[src]] is not None:
                    return {}
            case Compute(op=MatmulTiles() as mm, ins=(a, b)) if t[a] in candidates or t[b] in candidates:
                layer = kind.get(t[a])
                if t[b] in candidates or layer is None or layers[layer].plan.block.osw != mm.block.ibw:
                    return {}  # the A operand alone, its tiles the K tiles (its C fragments are A's, not B's)
            case ReadTiles(into=buf) | WriteTiles(src=buf) | McastSend(buf=buf) if t[buf] in candidates:
                return {}
            case Compute(ins=ins, outs=outs) if any(t[b] in candidates for b in (*ins, *outs)):
                return {}  # any other computation on a candidate: its page is needed
    if set(kind) != candidates:
        return {}
    return kind


class RegisterPrinter:
    """Prints the ops on register rings (a mixin of the general form's `EnginePrinter`, whose kernel `k` — its
    `in_registers`, `layers`, `rows` — writer `w`, thread index `tid`, ring slots and tile printers it uses)."""

    k: Any
    w: Writer
    tid: str
    read_slot: Any  # (annotations only: the methods are EnginePrinter's and TilePrinter's)
    write_slot: Any
    kept: Any
    b_loader: Any
    b_slot: Any
    operand_load: Any
    mma: Any
    unrolled: Any

    def held(self, buf: BufferId) -> bool:
        """Whether ring `buf` lives in registers."""
        return self.k.rings.template.get(buf, -1) in self.k.in_registers

    def rr(self, buf: BufferId) -> str:
        return f"rr_{self.k.rings.template[buf]}"

    def frags_of(self, buf: BufferId) -> Fragments:
        """The fragment layer whose layout register ring `buf` holds."""
        return self.k.layers[self.k.in_registers[self.k.rings.template[buf]]]

    def is_row_acc(self, buf: BufferId) -> bool:
        return self.k.rows is not None and int(self.k.program.buffer(buf).ring) in self.k.rows.reductions

    def declare_registers(self) -> None:
        """Each register ring's array, in the compute engine's branch."""
        for r, layer in sorted(self.k.in_registers.items()):
            n = "RROWS" if layer is None else f"{self.k.layers[layer].count} * 8"
            what = "a row vector: the lane's rows" if layer is None else "fragments: each of the warp's tiles"
            self.w.line(f"float rr_{r}[{n}];  // ring {r} in registers, {what}")

    def register_op(self, op: ChoreoOp, env: dict[LoopVar, str], mark: str) -> bool:
        """Print `op` if it is an op on a register ring, and say whether it was."""
        match op:
            case Reserve(buf) | Push(buf) | Wait(buf) | Pop(buf) if self.held(buf):
                self.w.line("", f"{mark} (ring {self.k.rings.template[buf]} in registers: the same warps' order)")
            case PackAcc(acc=acc, to=to) if self.held(to):
                with self.w.block("", mark):
                    if self.is_row_acc(acc):
                        self.quad_pack(acc, to)
                    else:
                        self.copy_fragments(acc, to)
            case Compute(op=RowReduce() as rr, ins=(src,), acc=acc) if self.held(src) and acc is not None:
                self.fold_quads(rr, src, acc, env, mark)
            case Compute(op=ScaleAcc(), ins=(src,), acc=acc) if self.held(src) and acc is not None:
                self.scale_by_rows(src, acc, mark)
            case Compute(op=MatmulTiles() as mm, ins=(a, b), acc=acc) if self.held(a) and acc is not None:
                self.matmul_held_a(mm, a, self.kept(b), self.k.layers[self.k.rings.template[acc]], mark)
            case Compute(op=Map() as m, ins=ins, outs=(dst,)) if any(self.held(b) for b in (*ins, dst)):
                self.map_held(op, m, ins, dst, env, mark)
            case _:
                return False
        return True

    # ---- the lane's place ------------------------------------------------------------------------------------

    @contextmanager
    def elements(self, f: Fragments) -> Iterator[None]:
        """The loops over the lane's fragments of `f` (q) and each one's eight elements (e), unrolled: the register
        arrays are indexed by constants, and stay registers."""
        with self.unrolled(f"for (int q = 0; q < {f.count}; ++q)"), self.unrolled("for (int e = 0; e < 8; ++e)"):
            yield

    def lane_place(self, f: Fragments | None = None) -> None:
        """The lane's quad (g: its rows g and g + 8 of each tile) and its place in the quad (t4: its columns); with
        `f`, the first row and column of the lane's elements of `f` (`rbase`, `cbase`), to which each element adds a
        constant once its loops are unrolled — no value a position of each element, which nvcc would keep."""
        self.w.line(f"const int lane = {self.tid} % 32, g = lane >> 2, t4 = lane & 3;")
        self.w.line("(void)g; (void)t4;")
        if f is not None:
            rm = f.plan.block.osh // f.lane_grid[0]  # type: ignore[index]
            self.w.line(f"const int rbase = warp * {rm * 16} + g, cbase = 2 * t4;")
            self.w.line("(void)rbase; (void)cbase;")

    @staticmethod
    def share(f: Fragments, e: str = "e") -> str:
        """The lane's row share (index into a row vector's registers) of element `e` of fragment q of `f`."""
        return f"(q / {f.plan.block.osw}) * 2 + (({e} >> 1) & 1)"

    @staticmethod
    def page_row(f: Fragments, base: str = "rbase") -> str:
        """The band's element row of element e of fragment q of `f` (warp `warp` holds tile rows warp·rm …), from
        the lane's first (`base`)."""
        return f"{base} + (q / {f.plan.block.osw}) * 16 + 8 * ((e >> 1) & 1)"

    @staticmethod
    def page_col(f: Fragments, base: str = "cbase") -> str:
        """The page's element column of element e of fragment q of `f`, from the lane's first (`base`)."""
        return f"{base} + (q % {f.plan.block.osw}) * 16 + (e & 1) + 8 * (e >> 2)"

    def vector_row(self) -> str:
        """The band's element row of share s of a row vector in registers."""
        rm = self.k.rows.per_warp // 2
        return f"(warp * {rm} + s / 2) * 16 + g + 8 * (s & 1)"

    # ---- the ops ---------------------------------------------------------------------------------------------

    def copy_fragments(self, acc: BufferId, to: BufferId) -> None:
        """PackAcc of fragments into a register ring: the accumulator's values as they lie."""
        f = self.frags_of(to)
        with self.elements(f):
            self.w.line(f"{self.rr(to)}[q * 8 + e] = {f.name}[q].x[e];")

    def quad_pack(self, acc: BufferId, to: BufferId) -> None:
        """PackAcc of a row accumulator into a register row vector: each row's four shares (its quad's lanes)
        combined by two shuffles, the quad's first lane's value taken (a max of +0 and −0 depends on the order of
        its operands); the shares stay as they are."""
        r = self.k.rows.reductions[int(self.k.program.buffer(acc).ring)]
        racc = f"racc_{int(self.k.program.buffer(acc).ring)}"
        self.w.line(f"const int lane = {self.tid} % 32;")
        with self.unrolled("for (int s = 0; s < RROWS; ++s)"):
            self.w.line(f"float v = {racc}[s];")
            for m in QUAD_XOR:
                self.w.line(f"v = {r.c_combine('v', f'__shfl_xor_sync({FULL_MASK}, v, {m})')};")
            self.w.line(f"{self.rr(to)}[s] = __shfl_sync({FULL_MASK}, v, lane & ~3);")

    def fold_quads(self, rr: RowReduce, src: BufferId, acc: BufferId, env: dict[LoopVar, str], mark: str) -> None:
        """RowReduce of a register ring of fragments: each lane folds its elements into its shares of their rows,
        leaving out the columns at or past the row's width."""
        f = self.frags_of(src)
        t = int(self.k.program.buffer(acc).ring)
        r = self.k.rows.reductions[t]
        with self.w.block("", mark):
            self.lane_place(f)
            self.w.line(
                f"const long long col0 = (long long)({addr_expr(rr.at, env)}) * 16 + cbase;  // the lane's first"
            )
            padding = "// the row's padding is left out"
            with self.elements(f), self.w.block(f"if ({self.page_col(f, 'col0')} < {rr.cols})", padding):
                s, x = self.share(f), f"{self.rr(src)}[q * 8 + e]"
                self.w.line(f"racc_{t}[{s}] = {r.c_combine(f'racc_{t}[{s}]', r.c_pre(x))};")

    def scale_by_rows(self, src: BufferId, acc: BufferId, mark: str) -> None:
        """ScaleAcc by a register row vector: a sum's shares (each scales with the row), or fragments (each element
        by its row's value)."""
        vec = self.rr(src)
        with self.w.block("", mark):
            if self.is_row_acc(acc):
                t = int(self.k.program.buffer(acc).ring)
                r = self.k.rows.reductions[t]
                if r.combine != "add":  # (as `RowPrinter.scale_rows` says)
                    raise Unsupported(
                        f"scaling a row accumulator of a {r.name} reduction",
                        "only a sum's shares scale with the row's value (online softmax rescales its running sum)",
                    )
                with self.unrolled("for (int s = 0; s < RROWS; ++s)"):
                    self.w.line(f"racc_{t}[s] *= {vec}[s];")
                return
            f = self.k.layers[self.k.rings.template[acc]]
            with self.elements(f):
                self.w.line(f"{f.name}[q].x[e] *= {vec}[{self.share(f)}];")

    def matmul_held_a(self, mm: MatmulTiles, a: BufferId, b: Ring, fo: Fragments, mark: str) -> None:
        """A matmul whose A is a register ring of fragments: each of its tiles' eight float32 values packed two by
        two into the A fragment of mma.m16n8k16 (`spatialc_load_a_acc`, rounded to nearest even: the interpreter
        rounds a computed page so where a matmul reads it); B's fragments loaded from their page as elsewhere."""
        fa = self.frags_of(a)
        ibw, n = mm.block.ibw, mm.block.osw
        rm = mm.block.osh // fo.lane_grid[0]  # type: ignore[index]
        if fa.plan.block.osw != ibw or fo.lane_grid[1] != 1:  # type: ignore[index]
            raise Unsupported("a matmul of register fragments of another width", "A's tiles are its K tiles")
        with self.w.block("", mark), self.unrolled(f"for (int kk = 0; kk < {ibw}; ++kk)"):
            # A's fragments of the step (the warp's tile rows), then B's one at a time: a B fragment serves those rows
            # alone, and holding them all would take the registers O's and P's need.
            self.w.line(f"spatialc_frag<OPT> af[{rm}];")
            with self.unrolled(f"for (int r = 0; r < {rm}; ++r)"):
                self.w.line(f"spatialc_load_a_acc(af[r], {self.rr(a)} + (r * {ibw} + kk) * 8);")

            def b_tile(kk: str) -> str:
                slot = self.b_slot(mm, "c", kk, f"({kk} * {n} + c)")
                return f"ring_{b.id} + {self.read_slot(b.id)} * PAGE_{b.id} + {slot} * {TILE_ELEMS}"

            with self.unrolled(f"for (int c = 0; c < {n}; ++c)"):
                self.w.line("spatialc_frag<OPT> bf;")
                self.w.line(self.operand_load(self.b_loader(mm, b), "bf", b_tile, "kk", 1))
                with self.unrolled(f"for (int r = 0; r < {rm}; ++r)"):
                    self.w.line(self.mma(f"{fo.name}[r * {n} + c]", "af[r]", "bf", 1))

    def map_held(self, op: Compute, m: Map, ins: tuple[BufferId, ...], dst: BufferId, env, mark: str) -> None:
        """A map whose inputs are register rings: over the lane's fragment elements (a page of the band by a block
        or by head_dim), or over its rows (row vectors alone); into a register ring or into the newest page of a
        kept ring (the writer's), each lane storing its own elements."""
        frag = [self.frags_of(b) for b in ins if self.k.in_registers[self.k.rings.template[b]] is not None]
        if any(not self.held(b) for b in ins):
            raise Unsupported(f"stage {compute_text(m, self.k.program)} of a register ring and a page", "one or other")
        value = epilogue.value
        with self.w.block("", mark):
            self.lane_place(frag[0] if frag else None)
            if frag:
                self.map_fragments(m, ins, dst, frag[0], env, value)
            else:
                self.map_rows(m, ins, dst, value)

    def map_fragments(self, m: Map, ins, dst: BufferId, f: Fragments, env, value) -> None:
        firsts = {}  # each position's first row or column of the lane's elements
        for i, node in enumerate(dict.fromkeys(position_nodes(m.expr))):
            base = "rbase" if node.axis == VecAxis.ROW else "cbase"
            self.w.line(f"const int pos{i} = ({addr_expr(node.at, env)}) * 16 + {base};")
            firsts[node] = f"pos{i}"

        def pos_at(node: Pos) -> str:
            first = firsts[node]
            return self.page_row(f, first) if node.axis == VecAxis.ROW else self.page_col(f, first)

        with self.elements(f):
            self.w.line(f"const float v = {self.fragment_value(m, ins, f, value, pos_at)};")
            if self.held(dst):
                self.w.line(f"{self.rr(dst)}[q * 8 + e] = v;")
            else:  # the element of a kept page: its row and column of the band, row-major tiles
                ring = self.kept(dst)
                w = f.plan.block.osw
                self.w.line(f"const int row = {self.page_row(f)}, col = {self.page_col(f)};")
                at = f"((row / 16) * {w} + col / 16) * {TILE_ELEMS} + (row % 16) * 16 + col % 16"
                stored = f"{self.k.types.to_operand}(v)" if ring.c_type == "OPT" else "(EPIT)v"
                page = f"ring_{ring.id} + {self.write_slot(ring.id)} * PAGE_{ring.id}"
                self.w.line(f"SPATIALC_PAGE_ST({page} + {at}, {stored});")

    def fragment_value(self, m: Map, ins, f: Fragments, value, pos_at, e: str = "e") -> str:
        """Map `m`'s value of element `e` of the lane's fragment q of `f`, its inputs register rings (fragments of
        `f`'s layout, or row vectors) and its positions `pos_at`'s."""

        def loaded(i: int) -> str:
            b = ins[i]
            held_rows = self.k.in_registers[self.k.rings.template[b]] is None
            return f"{self.rr(b)}[{self.share(f, e)}]" if held_rows else f"{self.rr(b)}[q * 8 + {e}]"

        def no_cols(c) -> str:
            raise Unsupported("a column vector read beside register rings", "kept pages only")

        return value(m, False, no_cols, loaded, loaded, pos_at)

    def row_value(self, m: Map, ins, value) -> str:
        """Map `m`'s value of the lane's row share s, its inputs register row vectors."""

        def loaded(i: int) -> str:
            return f"{self.rr(ins[i])}[s]"

        def none(node) -> str:
            raise Unsupported("a position or a column vector in a map of row vectors", "a row vector has one column")

        return value(m, False, none, loaded, loaded, none)

    def map_rows(self, m: Map, ins, dst: BufferId, value) -> None:
        with self.unrolled("for (int s = 0; s < RROWS; ++s)"):
            self.w.line(f"const float v = {self.row_value(m, ins, value)};")
            if self.held(dst):
                self.w.line(f"{self.rr(dst)}[s] = v;")
            else:  # a row vector's page: the row's value in each of its 16 columns, 4 a lane of its quad
                ring = self.kept(dst)
                self.w.line(f"const int row = {self.vector_row()};")
                page = f"ring_{ring.id} + {self.write_slot(ring.id)} * PAGE_{ring.id}"
                with self.unrolled("for (int c = 0; c < 4; ++c)"):
                    at = f"(row / 16) * {TILE_ELEMS} + (row % 16) * 16 + 4 * t4 + c"
                    self.w.line(f"SPATIALC_PAGE_ST({page} + {at}, (EPIT)v);")
