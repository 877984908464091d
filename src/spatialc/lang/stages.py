"""What a program computes, as the embedded language declares it: the stages a `Builder` records — reads and
writes of tensors, the matmul (and split-K's partial sums), maps and elementwise ops, row and column reductions,
attention — which verify's rule 8 proves the traced engines compute.

`StageDeclarations` is a base of `builder.Builder`, whose declared tensors, rings and stages it reads and extends
(annotated below).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import clipped
from ..ir.ids import BufferId, StageId
from ..ir.nodes import ComputeStage, ReadStage, Stage, Tensor, WriteStage
from ..ir.nodes import Engine as IREngine
from ..ir.ops import (
    MATMUL_PRECISIONS,
    NO_FP32_MATMUL,
    AddPartial,
    Attention,
    BlockShape,
    ComputeOp,
    Map,
    MatmulTiles,
    Precision,
)
from ..numerics.attention import FLOAT32_HOLDS, keyless, valid_scale
from .handles import RingRef, StageRef, TensorRef, expect, named, whole
from .lines import refuse, user_line
from .maps import col_reduce_op, col_rings, formula, reduce_op, reduced_cols, reduced_rows, vector_rings


class StageDeclarations:
    """The stage declarations of a `Builder` (its base): `p.read`, `p.matmul`, `p.map`, `p.reduce`, `p.col_reduce`,
    … ."""

    precision: Precision  # (annotations only: the state is Builder's)
    tensors: list[Tensor]
    buffers: list[Any]
    stages: list[Stage]
    declared: dict[str, tuple[str, int]]
    engine: tuple[int, str] | None
    pushed: set[BufferId]
    row_accs: set[BufferId]
    packed: dict[BufferId, set[BufferId]]
    vector_maps: set[BufferId]

    def stage(self, ref: StageRef) -> Stage:
        expect(ref, StageRef, "the stage")  # (another program's is refused, not read as this one's by its number)
        return self.stages[int(ref.id)]

    def buffer_name(self, bid: BufferId) -> str:
        return self.buffers[int(bid)].name

    def matmul_precision(self, what: str) -> Precision:
        """The program's precision as `what` (a matmul stage, a product) multiplies it: refused, with the fix, where
        it is float32 (a precision of programs with no matmul alone)."""
        if self.precision not in MATMUL_PRECISIONS:
            raise refuse(f"{what}: {NO_FP32_MATMUL}")
        return self.precision

    def _stage(self, name: str, kind: Any, engine: str, ins: tuple, outs: tuple) -> StageRef:
        named("stage", name)
        if any(s.name == name for s in self.stages):
            raise refuse(f"a second stage named {name!r}")
        s = Stage(StageId(len(self.stages)), name, kind, IREngine(engine), ins, outs)
        self.stages.append(s)
        self.declared[f"stage {name}"] = user_line()  # an error about the stage names it so
        return StageRef(self, s.id, name, getattr(kind, "op", None))

    def read(self, name: str, tensor: TensorRef, into: RingRef, engine: str = "reader") -> StageRef:
        """Stage: `tensor` is read into the pages of `into`."""
        expect(tensor, TensorRef, f"the tensor stage {name} reads")
        expect(into, RingRef, f"the ring stage {name} fills")
        return self._stage(name, ReadStage(tensor.id), engine, (), (into.id,))

    def matmul(
        self,
        name: str,
        a: RingRef,
        b: RingRef,
        out: RingRef,
        block: tuple[int, int, int],
        sub_blocks=(1, 1),
        partial: RingRef | None = None,
    ) -> StageRef:
        """Stage: the product of A's and B's pages, `block` = (output tile rows, columns, K tiles a step), into
        `out`'s pages — and, split over sites (split-K), a part of K's sum into `partial`'s."""
        rings = (("operand A", a), ("operand B", b), ("output", out))
        for what, ring in (*rings, *((("partial sums", partial),) if partial is not None else ())):
            expect(ring, RingRef, f"the {what} ring of stage {name}")
        prec = self.matmul_precision(f"matmul {name}")
        op = MatmulTiles(BlockShape(*block), tuple(sub_blocks), prec)  # type: ignore[arg-type]
        outs = (out.id,) if partial is None else (out.id, partial.id)
        return self._stage(name, ComputeStage(op), "compute", (a.id, b.id), outs)

    def add_partials(self, name: str, src: RingRef) -> StageRef:
        """Stage: the partial sums in `src`'s pages are added to the accumulator (split-K's owner site)."""
        expect(src, RingRef, f"the ring stage {name} adds")
        return self._stage(name, ComputeStage(AddPartial()), "compute", (src.id,), ())

    def elementwise(self, name: str, op: ComputeOp, src: RingRef | Sequence[RingRef], dst: RingRef) -> StageRef:
        """Stage: `op` (an ir.ops Map — relu(), bias(…), scalar(…), any formula — or Requant) from `src`'s pages
        into `dst`'s; `src` a list of rings for a Map of several (its Arg(i) the i-th)."""
        srcs = self._rings(f"stage {name}", src, dst)
        return self._stage(name, ComputeStage(op), "compute", tuple(s.id for s in srcs), (dst.id,))

    def map(self, name: str, expr: Any, src: RingRef | Sequence[RingRef], dst: RingRef) -> StageRef:
        """Stage: `expr` of the front pages of `src`'s rings, element by element, into `dst`'s pages — an ew
        expression over `ew.inputs(k)` (input i the i-th ring) or a function given one value a ring (`lambda x, m:
        ew.exp(x - m)`). A ring a row reduction fills is a row vector, each element its row's value; `ew.col(name)`
        the parameter tensor `name`, one value a column; `ew.row(name)` the parameter tensor `name`, one value a
        row."""
        srcs = self._rings(f"map {name}", src, dst)
        filled = {x for st in self.stages for x in st.outs}
        for s in srcs:
            if s.id not in filled:
                raise refuse(f"map {name} reads {s.name}, which no stage declared before it fills")
        op = Map(formula(self, name, expr, srcs))
        return self._stage(name, ComputeStage(op), "compute", tuple(s.id for s in srcs), (dst.id,))

    @staticmethod
    def _rings(what: str, src: RingRef | Sequence[RingRef], dst: RingRef) -> tuple[RingRef, ...]:
        """The rings `what` (an elementwise stage or a map) reads, one or a list of them, each checked a ring, as
        `dst`, the ring it fills."""
        srcs = tuple(src) if isinstance(src, list | tuple) else (src,)
        if not srcs:
            raise refuse(f"{what} reads at least one ring")
        for s in srcs:
            expect(s, RingRef, f"a ring {what} reads")
        expect(dst, RingRef, f"the ring {what} fills")
        return srcs

    def reduce(self, name: str, op: str, src: RingRef, dst: RingRef, cols: int | None = None) -> StageRef:
        """Stage: each row of `src`'s pages folded by `op` (max, min, sum, sumsq, absmax) over its first `cols`
        elements — by default the columns of the tensor its values come from; past them is padding — into a row
        vector in `dst`'s pages (a page one tile column wide, each row's value in every column)."""
        expect(src, RingRef, f"the ring row reduction {name} reads")
        expect(dst, RingRef, f"the ring row reduction {name} fills")
        n = reduced_cols(self, name, src) if cols is None else whole(cols, f"row reduction {name}'s cols")
        return self._stage(name, ComputeStage(reduce_op(name, op, n)), "compute", (src.id,), (dst.id,))

    def col_reduce(self, name: str, op: str, src: RingRef, dst: RingRef, rows: int | None = None) -> StageRef:
        """Stage: each column of `src`'s pages folded by `op` (max, min, sum, sumsq, absmax) down the `rows` rows of
        the tensor read into `src` (the default; past them is padding) — torch's x.sum(0), x.amax(0), a bias
        gradient — into a column vector in `dst`'s pages (a page one tile row high, each column's value in every
        row). The engines fold it page by page into an accumulator of one value a column (`acc.reduce(stage, page,
        row=…, width=…)`)."""
        expect(src, RingRef, f"the ring column reduction {name} reads")
        expect(dst, RingRef, f"the ring column reduction {name} fills")
        if src.id in self.row_vectors():
            raise refuse(
                f"column reduction {name} of {src.name}, a row vector (one value a row, a row reduction's): a column"
                " reduction folds the columns of the pages a read fills (p.read)"
            )
        given = None if rows is None else whole(rows, f"column reduction {name}'s rows")
        reduce = col_reduce_op(name, op, reduced_rows(self, name, src, given))
        return self._stage(name, ComputeStage(reduce), "compute", (src.id,), (dst.id,))

    def attention(
        self,
        name: str,
        q: RingRef,
        k: RingRef,
        v: RingRef,
        o: RingRef,
        lse: RingRef,
        causal: bool = False,
        scale: float | None = None,
    ) -> StageRef:
        """Stage: the declaration `spatialc.attention` makes — O = softmax(scale · Q·Kᵀ + mask) · V into `o`'s pages
        and LSE, each query row's log-sum-exp, into `lse`'s — of the tensors read into `q`, `k` and `v` (their rows a
        head: seq_q and seq_kv; query head h reads KV head h // (Q's groups / K's)). No engine runs it as one op:
        the engines run the online recurrence, which rule 8 proves equal to it (docs/verification.md). `scale`
        defaults to 1/√head_dim."""
        for what, ring in (("Q", q), ("K", k), ("V", v), ("O", o), ("LSE", lse)):
            expect(ring, RingRef, f"the {what} ring of stage {name}")
        self.matmul_precision(f"attention {name}")
        qt, kt = (self._read_into(name, what, ring) for what, ring in (("Q", q), ("K", k)))
        if kt.groups < 1 or qt.groups % kt.groups:
            raise refuse(f"attention {name}: Q's {qt.groups} heads are not a multiple of K's {kt.groups}")
        if not isinstance(causal, bool):
            raise refuse(f"attention {name}'s causal is True or False, not {type(causal).__name__} {causal!r}")
        sc = 1.0 / math.sqrt(qt.elems[1]) if scale is None else scale
        if not isinstance(sc, int | float) or not valid_scale(sc):  # spatialc.attention's and verify's predicate
            raise refuse(
                f"attention {name}'s scale is a finite number > 0, not {clipped(repr(scale))} ({FLOAT32_HOLDS})"
            )
        why = keyless(qt.elems[0], kt.elems[0], causal)
        if why is not None:
            raise refuse(f"attention {name}: {why}")
        op = Attention(float(sc), qt.elems[0], kt.elems[0], qt.groups // kt.groups, causal)
        ins, outs = (q.id, k.id, v.id), (o.id, lse.id)
        return self._stage(name, ComputeStage(op), "compute", ins, outs)

    def _read_into(self, stage: str, what: str, ring: RingRef) -> Tensor:
        """The tensor a read stage declared before reads into `ring`."""
        for s in self.stages:
            if isinstance(s.kind, ReadStage) and ring.id in s.outs:
                return self.tensors[int(s.kind.tensor)]
        raise refuse(f"attention {stage}: no read stage declared before it fills its {what} ring, {ring.name}")

    def row_vectors(self) -> set[BufferId]:
        """The rings whose pages hold row vectors, as far as the program is declared and traced: a row reduction's
        (`vector_rings`), a ring a row accumulator is packed into, and a ring a map of row vectors alone fills."""
        packed = {ring for ring, accs in self.packed.items() if accs & self.row_accs}
        return vector_rings(self) | packed | self.vector_maps

    def packs_later(self, ring: RingRef) -> str | None:
        """ "row" or "column" where `ring` holds row or column vectors (a reduction's) the engine being traced packs
        and has not pushed yet — a wait for it now could never end — else None."""
        if self.engine is None or ring.id in self.pushed:
            return None
        kind = "row" if ring.id in vector_rings(self) else "column" if ring.id in col_rings(self) else None
        mine = any(ring.id in s.outs and s.engine.value == self.engine[1] for s in self.stages)
        return kind if mine else None

    def write(self, name: str, src: RingRef, tensor: TensorRef, engine: str = "writer") -> StageRef:
        """Stage: the pages of `src` are written to `tensor`."""
        expect(src, RingRef, f"the ring stage {name} empties")
        expect(tensor, TensorRef, f"the tensor stage {name} writes")
        return self._stage(name, WriteStage(tensor.id), engine, (src.id,), ())
