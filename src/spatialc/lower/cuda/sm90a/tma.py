"""The sm_90a form's pages as the copy engine lands them: each operand ring's `Panels` (one TMA box a panel, swizzled
by address), a residual's `TileBoxes` (one unswizzled box a tile), and the tensor maps the host encodes for them, one
per (tensor, box) the reader loads (`tensor_maps`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ....ir.nodes import PageLayout, SpatialProgram, TensorRole, panel_bytes
from ....ir.ops import ReadTiles
from ...artifact import TensorMap
from ...errors import Unsupported
from ..common.rings import TILE_ELEMS


def param_at(p: SpatialProgram, tensor) -> int:
    """The position of `tensor`'s parameter among the kernel's (Launch.params: tensor order), what TensorMap names."""
    return [t.id for t in p.tensors].index(tensor)


@dataclass(frozen=True, slots=True)
class Panels:
    """How a ring's page lies as the copy engine lands it: `rows` rows of `row_bytes` (the page, or its transpose
    for `panels_t`), in panels `width` bytes wide, each one TMA box."""

    rows: int
    row_bytes: int
    width: int
    transposed: bool
    elem: int  # bytes of an element

    @property
    def count(self) -> int:
        return self.row_bytes // self.width

    @property
    def box(self) -> tuple[int, int]:
        """The TMA box of one panel: (rows, columns) of the stored matrix."""
        return self.rows, self.width // self.elem

    @property
    def bytes(self) -> int:
        """Bytes of one panel: where the next one starts."""
        return self.rows * self.width

    @property
    def period(self) -> int:
        """The alignment a page keeps: the swizzle repeats every 8 rows of a panel."""
        return 8 * self.width


@dataclass(frozen=True, slots=True)
class TileBoxes:
    """How a ring's page of whole tiles in row-major order (`PageLayout.ROW`: a residual's, a gate's) lands: one
    16 x 16 box of the stored row-major matrix a tile, unswizzled, tile s of the page at byte s * 256 * elem, its
    rows one after another — the tile a page holds. `block_w` tiles a page row."""

    block_h: int
    block_w: int
    elem: int  # bytes of an element

    width = 0  # no swizzle
    transposed = False
    box = (16, 16)  # (rows, columns) of the stored matrix: one tile

    @property
    def count(self) -> int:
        return self.block_h * self.block_w

    @property
    def bytes(self) -> int:
        """Bytes of one box: where the next tile starts."""
        return TILE_ELEMS * self.elem

    @property
    def period(self) -> int:
        """The alignment a page keeps: every box starts on 128 bytes, as an unswizzled TMA destination must."""
        return 128


def panels_of(op: ReadTiles, layout: PageLayout, elem: int, name: str) -> Panels:
    """The panels of a page of `op`'s tiles in `layout` (`panels`, or `panels_t`: stored transposed), refused by
    name where its rows take no swizzle span."""
    rows, cols = op.block_h * 16, op.block_w * 16
    if layout == PageLayout.PANELS_T:
        rows, cols = cols, rows
    width = panel_bytes(cols * elem)
    if width is None:
        raise Unsupported(f"rows of {cols * elem} bytes in {name}'s pages", "a swizzled panel is 32, 64 or 128 wide")
    return Panels(rows, cols * elem, width, layout == PageLayout.PANELS_T, elem)


def tensor_maps(
    p: SpatialProgram, rings, reader_ops
) -> tuple[tuple[TensorMap, ...], frozenset[int], dict[int, Panels | TileBoxes], dict[int, str]]:
    """One tensor map per (tensor, box) the reader loads, the rings the copy engine fills, each one's panels (or tile
    boxes: a page of whole tiles, a residual's) and the stored layout (`KernelParam.order`) of each tensor the maps
    read: "rows" (row-major), "cols" (transposed)."""
    maps: dict[tuple[int, int, int, int], TensorMap] = {}
    filled: set[int] = set()
    panels: dict[int, Panels | TileBoxes] = {}
    stored: dict[int, str] = {}
    for op in reader_ops:
        if not isinstance(op, ReadTiles):
            continue
        t = p.tensor(op.tensor)
        ring = rings.kept(op.into)
        if t.role != TensorRole.INPUT or ring is None or ring.c_type != "OPT":
            raise Unsupported(f"a ReadTiles of {t.name}", "the copy engine fills operand pages only")
        if not ring.layout.panels and ring.layout != PageLayout.ROW:
            raise Unsupported(
                f"{t.name}'s pages in {ring.layout.value} layout ({ring.name}), planned for the other forms",
                "the sm_90a form's copy engine lands swizzled panels; build with form='sm90a' (--form sm90a) to"
                " plan for it, or to see why it is not",
            )
        if (op.stride_h, op.stride_w) != (t.tiles[1], 1) or t.tiles[1] % op.block_w:
            raise Unsupported(
                f"a ReadTiles of {t.name} with strides ({op.stride_h}, {op.stride_w})",
                "a TMA box is a rectangle of the tensor's tile grid",
            )
        if op.block_h * op.block_w * TILE_ELEMS != ring.page:
            raise Unsupported(
                f"a ReadTiles of {op.block_h}x{op.block_w} tiles into {ring.name}'s pages of {ring.page // TILE_ELEMS}",
                "the full barrier expects the whole page's bytes, and the boxes must bring exactly those",
            )
        pan: Panels | TileBoxes
        if ring.layout == PageLayout.ROW:  # a page of whole tiles (a residual's, beside C's value): a box a tile
            pan = TileBoxes(op.block_h, op.block_w, ring.elem_bytes)
        else:
            pan = panels_of(op, ring.layout, ring.elem_bytes, t.name)
            if pan.rows > 256:
                raise Unsupported(f"pages of {pan.rows} rows of {t.name}", "a TMA box side is at most 256")
        if t.groups > 1 and pan.transposed:
            raise Unsupported(f"{t.name}'s groups transposed", "a grouped tensor is stored a group after another")
        at = param_at(p, op.tensor)
        order = "cols" if pan.transposed else "rows"
        if stored.setdefault(at, order) != order:
            raise Unsupported(f"{t.name} read both as it is and transposed", "a tensor is stored one way")
        maps.setdefault((at, *pan.box, pan.width), TensorMap(len(maps), at, pan.box, pan.width, pan.transposed))
        if panels.setdefault(ring.id, pan) != pan:
            raise Unsupported(f"pages of two shapes in {ring.name}", "each stage is laid out for one box")
        filled.add(ring.id)
    return tuple(maps.values()), frozenset(filled), panels, stored
