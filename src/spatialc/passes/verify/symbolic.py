"""The algebra the semantic rule reasons in: affine forms over symbols with known ranges, and the values of tiles.

A symbol stands for a whole range of values at once — a loop's iteration, an item's grid coordinate, a tile's row
or column inside a page, a reduction index — so one form describes what an op does in every iteration, and no
proof enumerates iterations or elements. A symbol's range is 0..n-1 with n ≥ 2: a loop of one iteration has no
symbol, its variable is the constant 0, so two forms describe the same function on their box of values exactly when
they are equal as forms (every coefficient can be read off by moving one symbol from 0 to 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...ir.ids import TensorId
from ...ir.ops import ComputeOp


@dataclass(frozen=True, slots=True)
class Sym:
    """A symbol: `kind` and `ident` make it unique; `label` is how messages name it."""

    kind: str
    ident: object
    label: str = field(compare=False)

    def __repr__(self) -> str:
        return self.label


WITNESS_LIMIT = 1 << 14  # points a message may enumerate to name a concrete tile (the proof never does)

# The tile a page value describes: row and column inside the page. A page's value is a formula in these two,
# instantiated at each read (a consumer puts its own symbols in their place).
PR = Sym("page", "row", "page row")
PC = Sym("page", "col", "page col")


class Aff:
    """`const + Σ coef·sym`, immutable, with no zero coefficients (so equal functions are equal forms)."""

    __slots__ = ("const", "terms", "_hash")

    def __init__(self, const: int = 0, terms: Mapping[Sym, int] | None = None) -> None:
        self.const = const
        self.terms = {s: c for s, c in (terms or {}).items() if c}
        self._hash: int | None = None

    @staticmethod
    def of(sym: Sym, coef: int = 1) -> Aff:
        return Aff(0, {sym: coef})

    def __add__(self, other: Aff | int) -> Aff:
        if isinstance(other, int):
            return Aff(self.const + other, self.terms)
        terms = dict(self.terms)
        for s, c in other.terms.items():
            terms[s] = terms.get(s, 0) + c
        return Aff(self.const + other.const, terms)

    def __sub__(self, other: Aff | int) -> Aff:
        return self + (other * -1 if isinstance(other, Aff) else -other)

    def __mul__(self, k: int) -> Aff:
        return Aff(self.const * k, {s: c * k for s, c in self.terms.items()})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Aff) and self.const == other.const and self.terms == other.terms

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self.const, frozenset(self.terms.items())))
        return self._hash

    def __repr__(self) -> str:
        return self.text()

    def coef(self, sym: Sym) -> int:
        return self.terms.get(sym, 0)

    def syms(self) -> set[Sym]:
        return set(self.terms)

    def subst(self, m: Mapping[Sym, Aff]) -> Aff:
        """Each symbol of `m` replaced by its form."""
        if not any(s in m for s in self.terms):
            return self
        out = Aff(self.const)
        for s, c in self.terms.items():
            out = out + (m[s] * c if s in m else Aff.of(s, c))
        return out

    def span(self, ranges: Mapping[Sym, int]) -> tuple[int, int]:
        """The least and greatest value over every symbol's range."""
        lo = self.const + sum(min(0, c * (ranges[s] - 1)) for s, c in self.terms.items())
        hi = self.const + sum(max(0, c * (ranges[s] - 1)) for s, c in self.terms.items())
        return lo, hi

    def at(self, values: Mapping[Sym, int]) -> int:
        """The value where each symbol takes `values[sym]` (0 when absent)."""
        return self.const + sum(c * values.get(s, 0) for s, c in self.terms.items())

    def text(self) -> str:
        parts = [f"{c}·{s.label}" if c != 1 else s.label for s, c in self.terms.items()]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")


def one_to_one(form: Aff, ranges: Mapping[Sym, int]) -> tuple[int, int] | None:
    """(first, count) when `form` takes each value of first..first+count-1 exactly once over the box of its own
    symbols, else None. That holds exactly when the coefficients, in absolute value and sorted, are the place
    values of a mixed radix: 1, n1, n1·n2, … for the ranges n1, n2, … of the symbols they belong to."""
    step = 1
    for c, n in sorted((abs(c), ranges[s]) for s, c in form.terms.items()):
        if c != step:
            return None
        step *= n
    return form.span(ranges)[0], step


def split(flat: Aff, cols: int, ranges: Mapping[Sym, int]) -> tuple[Aff, Aff] | None:
    """A flat tile index of a grid `cols` tiles wide as (row, column) forms, when the column never leaves
    0..cols-1 over the ranges (so no step of the index wraps into another row); else None."""
    row, col = _parts(flat.const, cols, False)
    for toward_zero in (False, True):
        r_terms, c_terms = {}, {}
        for s, c in flat.terms.items():
            r_terms[s], c_terms[s] = _parts(c, cols, toward_zero)
        col_form = Aff(col, c_terms)
        lo, hi = col_form.span(ranges)
        if lo >= 0 and hi < cols:
            return Aff(row, r_terms), col_form
    return None


def _parts(value: int, cols: int, toward_zero: bool) -> tuple[int, int]:
    if toward_zero and value < 0:
        q, r = divmod(-value, cols)
        return -q, -r
    return divmod(value, cols)


# ---- what a tile holds -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TileRef:
    """Tile (row, col) of a tensor's tile grid; `origin`, for messages only, the read that fetched it (site,
    engine, op text)."""

    tensor: TensorId
    row: Aff
    col: Aff
    origin: tuple[int, str, str] | None = field(default=None, compare=False)

    def subst(self, m: Mapping[Sym, Aff]) -> TileRef:
        return TileRef(self.tensor, self.row.subst(m), self.col.subst(m), self.origin)


@dataclass(frozen=True, slots=True)
class StepScales:
    """Where a block-scaled product's promotion reads its scales (`ops.BlockScales`, `verify.blockscale`): the tile
    row of A's scales and the tile column of B's (the op's address plus the tile's place in the page), and the K tile
    the op says its step starts at plus the tile's place along the step (`kk`), which is the product's own K tile
    where the address is right."""

    scales: ComputeOp  # the op's BlockScales, addresses left out (what the stage declares)
    row: Aff
    col: Aff
    k: Aff
    kk: Aff
    group: Aff | None = None  # a grouped GEMM's: the group whose scale matrices it reads

    def subst(self, m: Mapping[Sym, Aff]) -> StepScales:
        group = None if self.group is None else self.group.subst(m)
        return StepScales(self.scales, self.row.subst(m), self.col.subst(m), self.k.subst(m), self.kk.subst(m), group)


@dataclass(frozen=True, slots=True)
class Product:
    """Σ over the `sums` symbols (each over its range) of tile a × tile b: each a tensor's tile, or a computed one
    (what a page filled by an elementwise stage holds: the second matmul of an MLP multiplies gelu(…)). `scale`: a
    block-scaled product's promotion, each K step's sum times its rows' and columns' scales."""

    a: TileRef | Cell
    b: TileRef | Cell
    sums: tuple[Sym, ...]
    scale: StepScales | None = None

    def subst(self, m: Mapping[Sym, Aff]) -> Product:
        scale = None if self.scale is None else self.scale.subst(m)
        return Product(self.a.subst(m), self.b.subst(m), self.sums, scale)


@dataclass(frozen=True, slots=True)
class Copy:
    """A tile read from a tensor."""

    ref: TileRef

    def subst(self, m: Mapping[Sym, Aff]) -> Copy:
        return Copy(self.ref.subst(m))


@dataclass(frozen=True, slots=True)
class Partial:
    """Σ over the `sums` symbols of the workspace tile `ref`: a partial sum another site left there (split-K), which
    the semantic rule replaces by the products that site wrote to that tile."""

    ref: TileRef
    sums: tuple[Sym, ...]

    def subst(self, m: Mapping[Sym, Aff]) -> Partial:
        return Partial(self.ref.subst(m), self.sums)


@dataclass(frozen=True, slots=True)
class AccSum:
    """A packed accumulator tile: the sum of its products and added partial sums (none: zero)."""

    terms: tuple[Product | Partial, ...]

    def subst(self, m: Mapping[Sym, Aff]) -> AccSum:
        return AccSum(tuple(t.subst(m) for t in self.terms))


@dataclass(frozen=True, slots=True)
class Elem:
    """An elementwise op applied to the same tile of each of its input pages (`inners`, in the order of its rings); a
    column vector (a bias) is read at tile column `bias_col`, a row vector (a per-row scale) at tile row `bias_row`;
    `origin`, for messages only, the op that applied it."""

    op: ComputeOp
    inners: tuple[Cell, ...]
    bias_col: Aff | None
    origin: tuple[int, str, str] | None = field(default=None, compare=False)
    bias_row: Aff | None = None

    def subst(self, m: Mapping[Sym, Aff]) -> Elem:
        inners = tuple(c.subst(m) for c in self.inners)
        col = None if self.bias_col is None else self.bias_col.subst(m)
        row = None if self.bias_row is None else self.bias_row.subst(m)
        return Elem(self.op, inners, col, self.origin, row)


@dataclass(frozen=True, slots=True)
class RowTerm:
    """What one row reduction op added to a row accumulator: the elements of tile `cell` of the page it reduced (the
    tile in the accumulator's row, at tile column `col` of the row), over the `sums` symbols (each over its range);
    `origin`, for messages only, the op that added it."""

    cell: Cell
    col: Aff
    sums: tuple[Sym, ...]
    origin: tuple[int, str, str] | None = field(default=None, compare=False)

    def subst(self, m: Mapping[Sym, Aff]) -> RowTerm:
        return RowTerm(self.cell.subst(m), self.col.subst(m), self.sums, self.origin)


@dataclass(frozen=True, slots=True)
class RowVec:
    """A packed row accumulator: each row's `op` (a RowReduce) over the elements of its terms (none: the identity)."""

    op: ComputeOp
    terms: tuple[RowTerm, ...]

    def subst(self, m: Mapping[Sym, Aff]) -> RowVec:
        return RowVec(self.op, tuple(t.subst(m) for t in self.terms))


Cell = Copy | AccSum | Elem | RowVec


@dataclass(frozen=True, slots=True)
class Page:
    """A page's value: `rows` rows of `width` tiles, tile (r, c) at slot r·width + c holding `cell` at
    page row r, page col c."""

    rows: int
    width: int
    cell: Cell

    def view(self, rows: int, width: int) -> Cell | None:
        """The cell as a consumer reading `rows` rows of `width` tiles sees it (its page row and column in PR and
        PC), or None when its slots would land elsewhere in this page's layout (or past its end)."""
        if width == self.width and rows <= self.rows:
            return self.cell
        if rows == 1 and width <= self.width:
            return self.cell.subst({PR: Aff(0)})
        return None
