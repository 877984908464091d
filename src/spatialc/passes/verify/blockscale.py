"""Rule 8 for a block-scaled matmul: C = Σ_g (A_g · B_g) · sa[i, g] · sb[g, j], each scale at its own (row, group)
and (group, column) (`numerics.blockscale` defines the sum; `ops.BlockScales` the op).

A block-scaled product is promoted once per K step: its tiles' sum times the scale of each row of A and each
column of B for the step's K group. The proof at a tile of C, for each product term of its sum (`semantics`
shows the terms' K tiles cover K exactly once, so each step is promoted exactly once — a step promoted twice is a
K tile summed twice, one skipped a K tile never summed):

- a grouped GEMM's term reads the scale tensors' matrices of its own group — C's tile's group — and A's at its row
  within the group (a program of one group reads no group);
- the term is promoted with the scales the stage declares (the same tensors, blocks and groups: `same_op`), and
  a term of the stage's matmul with none is refused;
- A's scales are read at the C tile's own row and B's at its own column (the op's address plus the tile's place
  in the page, equal as forms to the tile's row and column);
- the op's K address plus the tile's place along the step is the product's own K tile, as a form: the group the
  op reads is the step's;
- no step spans two groups of either operand: the step's first K tile is a multiple of its width in tiles and the
  group a multiple of the step (or the whole of K lies in one group), so every K element of the step has the
  group of the step's first. An MXFP8 program's groups are 32 of K (e8m0 scales) and its steps one group each (2
  tiles): the same proof, at that width (tests/blockscale/test_mx_mutations.py).

Last (`check_scale_types`, once the products are proved), the scales' element type — float32 or e8m0, none other
(a saved file may say int8) — and the layouts against it, since the
step every reader promotes at is read from the layouts (`numerics.blockscale.step_of`): a group narrower than
PROMOTION_K (128) only of e8m0 scales, both operands', or one of all of K (a K under 128: `row`, `col`, `tensor`,
whose one group no step can straddle), and e8m0 scales only in OCP MX's groups of MX_K (32) — the
kernel promotes float32 scales every 128 and e8m0 codes by their exponents (lower/cuda/common/blockscale.py). Then
the layouts against the operands (a saved file may say anything): a block spans one row (column) or more — the
kernel divides by `outer` — and e8m0 blocks exactly one (OCP MX's 1 × 32, 32 × 1); a float32 group is whole steps
of 128 or all of K, since the reference promotes every 128 with the group of the step's first element; and each
scale tensor has the shape its layout takes of its operand (`numerics.blockscale.scale_shape`), one matrix a group
of a grouped GEMM — a tensor short of it had K past it multiplied by zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import SemanticError
from ...ir.nodes import ComputeStage, DType, Stage, Tensor
from ...ir.ops import KScale, MatmulTiles, TileAddr
from ...numerics.blockscale import MX_K, PROMOTION_K, scale_shape
from .symbolic import Aff, StepScales

SCALE_TYPES = frozenset({DType.FLOAT32, DType.E8M0})  # what a block scale holds (docs/json.md)

if TYPE_CHECKING:
    from ...ir.index import ProgramIndex
    from .dataflow import MatmulDecl
    from .semantics_value import _Proof
    from .symbolic import Product


def unplaced(op: MatmulTiles) -> MatmulTiles:
    """`op` with its scales' addresses left out: what its stage declares (the addresses are proved apart)."""
    if op.scales is None:
        return op
    zero = TileAddr(0)
    return dataclasses.replace(op, scales=dataclasses.replace(op.scales, rows=zero, cols=zero, k=zero, group=None))


def step_scales(op: MatmulTiles, addr: Callable[[TileAddr], Aff], row: Aff, col: Aff, kk: Aff) -> StepScales | None:
    """Where a product of `op` reads its scales (None: `op` is not block-scaled): the op's addresses as forms
    (`addr`) plus the tile's place in the page (`row`, `col`) and along the step (`kk`)."""
    s = op.scales
    if s is None:
        return None
    group = None if s.group is None else addr(s.group)
    return StepScales(unplaced(op).scales, addr(s.rows) + row, addr(s.cols) + col, addr(s.k), kk, group)  # type: ignore[arg-type]


def check_term(proof: _Proof, t: Product, mm: MatmulDecl, row: Aff, col: Aff, k: Aff, path: str) -> None:
    """A product term of a tile of C is promoted as the stage declares, at its own row, column and K group."""
    declared = getattr(getattr(mm.stage.kind, "op", None), "scales", None)
    if declared is None and t.scale is None:
        return
    where = f"{proof.tile_text(proof.base())}{path}"
    if t.scale is None or declared is None:
        what = "promotes no scales" if t.scale is None else "promotes its products with scales"
        says = "declares block scales" if declared is not None else "declares none"
        raise proof.fail(f"{where} {what} where stage {mm.stage.name} {says}", t.a, t.b)
    s = t.scale
    index = proof.site.index
    names = [index.tensors[x.tensor].name for x in (declared.a, declared.b)]
    row = _group_checked(proof, t, s, row, names, path)
    for what, got, want in (
        (f"{names[0]} (A's scales) at tile row", s.row, row),
        (f"{names[1]} (B's) at tile column", s.col, col),
    ):
        if got != want:
            values = proof.differ([(got, want)], set(proof.ranges))
            raise proof.fail(
                f"{proof.tile_text(values)} ({proof.item_text(values)}){path} promotes with {what} {got.at(values)},"
                f" not its own {want.at(values)}",
                t.a,
                t.b,
            )
    if s.k + s.kk != k:
        values = proof.differ([(s.k + s.kk, k)], set(proof.ranges))
        raise proof.fail(
            f"{proof.tile_text(values)} ({proof.item_text(values)}){path} promotes K tile {k.at(values)} with the"
            f" scales of the step at K tile {s.k.at(values)}: a scale of another K group than its product's",
            t.a,
            t.b,
        )
    width = mm.shape[2]
    for name, scale in zip(names, (declared.a, declared.b), strict=True):
        fault = _straddles(s.k, width, scale, proof.site.index.p.tile.cols, proof.ranges, mm.k_elems)
        if fault is not None:
            raise proof.fail(f"{where}: {fault} of {name}, promoted with the first group's scale", t.a, t.b)


def _group_checked(proof: _Proof, t: Product, s: StepScales, row: Aff, names: list[str], path: str) -> Aff:
    """The tile row A's scales are read at: C's `row` itself, or a grouped GEMM's row within its group once the
    scales are shown read at the group's own matrices (C's group, of the stacked output)."""
    out = proof.decl.out
    if out.groups == 1:
        if s.group is not None:
            raise proof.fail(
                f"{proof.tile_text(proof.base())}{path} reads its scales at group {s.group.text()} of a program of one"
                " group",
                t.a,
                t.b,
            )
        return row
    group = proof.group_of(row)
    if s.group is None or s.group != group:
        got = "no group" if s.group is None else None
        values = proof.base() if s.group is None else proof.differ([(s.group, group)], set(proof.ranges))
        got = got or f"the scales of group {s.group.at(values)}"  # type: ignore[union-attr]
        raise proof.fail(
            f"{proof.tile_text(values)} ({proof.item_text(values)}){path} promotes group {group.at(values)}'s"
            f" products with {got} ({names[0]}, {names[1]}): a scale of another group (expert) than its product's",
            t.a,
            t.b,
        )
    return row - group * out.group_tiles[0]


def _straddles(first: Aff, width: int, scale: KScale, tile: int, ranges, k: int) -> str | None:
    """Why a step of `width` K tiles starting at K tile `first` may span two groups of `scale`, or None. A group of
    all of the product's `k` is the only one: a step reaching past it reads K's zero padding, of no other group."""
    if scale.k >= k:
        return None
    group = scale.k // tile if scale.k % tile == 0 else 0
    aligned = all(c % width == 0 for c in (first.const, *first.terms.values()))
    if group and group % width == 0 and aligned:
        return None
    _, last = first.span(ranges)
    if (last + width) * tile <= scale.k:  # every step within the first group (a scale for all of K)
        return None
    return f"a K step of {width} tiles from K tile {first.text()} may span two groups of {scale.k} elements"


def check_scale_types(index: ProgramIndex) -> None:
    """Each block-scaled matmul's scale layouts fit their element type and its operands: groups narrower than
    PROMOTION_K only of e8m0 scales (both operands'), e8m0 scales only in OCP MX's blocks (1 × MX_K, MX_K × 1), blocks
    of one row (column) or more, a float32 group a multiple of PROMOTION_K or all of K, and each scale tensor of the
    shape its layout takes (`numerics.blockscale.scale_shape`) for as many groups as the product."""
    scaled = [
        (stage, stage.kind.op)
        for stage in index.p.stages
        if isinstance(stage.kind, ComputeStage) and isinstance(stage.kind.op, MatmulTiles) and stage.kind.op.scales
    ]
    for stage, op in scaled:
        assert op.scales is not None
        both = [(index.tensors[x.tensor], x) for x in (op.scales.a, op.scales.b)]
        where = f"stage {stage.name} is promoted by {both[0][0].name} and {both[1][0].name}"
        _check_types(where, both)
        for (t, x), (side, of) in zip(both, (("row", "A"), ("column", "B")), strict=True):
            if x.outer < 1:  # (a kernel would divide by it; a negative one reads the scales at negative rows)
                raise SemanticError(
                    f"{where}: {t.name}'s blocks span outer = {x.outer} {side}s of {of}; a block spans one {side} or"
                    " more"
                )
            if t.dtype == DType.E8M0 and x.outer != 1:
                raise SemanticError(
                    f"{where}: {t.name} holds e8m0 scales of blocks of outer = {x.outer} {side}s of {of}; OCP MX's"
                    f" e8m0 scales are one a {side} (outer = 1)"
                )
    if scaled:
        _check_shapes(index, scaled)


def _check_types(where: str, both: list[tuple[Tensor, KScale]]) -> None:
    """The scales' element type — float32, or e8m0 (OCP MX) — then the layouts' groups along K against it (the module
    docstring): the kernel and the reference read no scale of another type."""
    for t, _ in both:
        if t.dtype not in SCALE_TYPES:
            raise SemanticError(
                f"{where}: {t.name} holds {t.dtype.value} scales; a block scale is float32 or e8m0 (OCP MX's)"
            )
    mx = [t.dtype == DType.E8M0 for t, _ in both]
    if any(mx) and not all(mx):
        raise SemanticError(
            f"{where}, of element types {both[0][0].dtype.value} and {both[1][0].dtype.value}:"
            " e8m0 scales (OCP MX) are both operands' or neither's"
        )
    for t, x in both:
        if mx[0] and x.k != MX_K:
            raise SemanticError(
                f"{where}: {t.name} holds e8m0 scales of groups of {x.k} elements of K; OCP MX's e8m0 scales group"
                f" {MX_K}"
            )


def _check_shapes(index: ProgramIndex, scaled: list[tuple[Stage, MatmulTiles]]) -> None:
    """Each scale tensor holds the blocks its layout takes of its operand — ceil(M / outer) × ceil(K / k) of A's,
    ceil(K / k) × ceil(N / outer) of B's — a matrix a group of the product; and a float32 group is whole steps of
    PROMOTION_K or all of K, since the reference promotes every PROMOTION_K (`step_of`) with the group of the step's
    first element (a group of 192 would give K 128 … 191's scale to 192 … 255)."""
    from .declared import declared  # (declared imports dataflow, which imports this module)

    decl = declared(index)
    for stage, op in scaled:
        mm = decl.matmuls.get(stage.id)
        if mm is None or op.scales is None:
            continue
        (m, n), k = mm.value[0], mm.k_elems
        where = f"stage {stage.name} is promoted by {index.tensors[op.scales.a.tensor].name} and"
        where += f" {index.tensors[op.scales.b.tensor].name}"
        for x, extent, is_a in ((op.scales.a, m, True), (op.scales.b, n, False)):
            t = index.tensors[x.tensor]
            if t.dtype != DType.E8M0 and x.k < PROMOTION_K and x.k < k:  # (a group of all of K may be narrower)
                raise SemanticError(
                    f"{where}: {t.name} holds {t.dtype.value} scales of groups of {x.k} elements of K; a group narrower"
                    f" than {PROMOTION_K} is OCP MX's, of e8m0 scales"
                )
            if t.dtype != DType.E8M0 and x.k % PROMOTION_K and x.k < k:
                raise SemanticError(
                    f"{where}: {t.name} holds {t.dtype.value} scales of groups of {x.k} elements of K; a group is"
                    f" a multiple of {PROMOTION_K} (the promotion step) or all of K ({k})"
                )
            outer, ks = scale_shape(x, extent, k)
            want = (outer, ks) if is_a else (ks, outer)
            if t.elems != want:
                block, of = (f"{x.outer}x{x.k}", f"A's {m}x{k}") if is_a else (f"{x.k}x{x.outer}", f"B's {k}x{n}")
                raise SemanticError(
                    f"{where}: {t.name} holds {t.elems[0]}x{t.elems[1]} scales, but its layout ({block} blocks of"
                    f" {of} elements) takes {want[0]}x{want[1]}"
                )
            if t.groups != decl.out.groups:
                matrices = "matrix" if t.groups == 1 else "matrices"
                raise SemanticError(
                    f"{where}: {t.name} stacks {t.groups} {matrices} of scales; the product's {decl.out.groups} groups"
                    " take one each"
                )
