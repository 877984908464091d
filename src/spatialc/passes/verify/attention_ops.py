"""Rule 8's attention proof, the compute engine's ops (`verify/attention.py`): the value each op leaves in the page
it fills or the accumulator it adds into — a tree built by the recurrence's own constructors (`recurrence`) — and
where its tiles sit, each op refused where it reads tiles that do not line up (a product over unlike tiles, a
reduction or a mask at other columns than its page's, a rescale by other than one value a row).
"""

from __future__ import annotations

from ...ir.ops import Apply, Arg, Compute, Expr, Lit, Map, MatmulTiles, PackAcc, Pos, RowArg, RowReduce, VecAxis
from .attention_state import Proof, addr
from .recurrence import ACQUIRED, Geom, Tree, Val, ap, form_text, geom_text, lit, pin, vector
from .symbolic import PC, PR, Aff, Sym


def pack(proof: Proof, op: PackAcc) -> None:
    """An accumulator's value packed whole into a reserved page."""
    value, geom = proof.acc(op, op.acc)
    if geom is None:
        raise proof.wrong(op, f"it packs {proof.name(op.acc)}, which nothing added into")
    if op.accumulate or op.tiles != geom.rows * geom.width:
        raise proof.unsure(op, f"the semantic rule follows a pack of the accumulator's {geom.rows * geom.width} tiles")
    proof.fill(op, op.to, Val(value, geom))


def matmul(proof: Proof, op: Compute) -> None:
    """Pages' product added into an accumulator, the sum over like tiles (all head_dim tiles, for Q·Kᵀ)."""
    mm = op.op
    assert isinstance(mm, MatmulTiles) and op.acc is not None
    if mm.sub_blocks != (1, 1):
        raise proof.unsure(op, "the semantic rule follows an attention matmul of one sub-block")
    if mm.operand != proof.p.precision:
        raise proof.wrong(op, f"it multiplies in {mm.operand}, the program's operands are {proof.p.precision}")
    a, b = (proof.page(op, r).geom for r in op.ins)
    blk, t = mm.block, mm.transpose_b
    b_shape = (blk.osw, blk.ibw) if t else (blk.ibw, blk.osw)
    if (a.rows, a.width) != (blk.osh, blk.ibw) or (b.rows, b.width) != b_shape:
        raise proof.wrong(op, f"its block {blk.osh}x{blk.osw}x{blk.ibw} does not read its pages as they are laid out")
    x = Aff.of(Sym("attention", "sum", "kk")) if blk.ibw > 1 else Aff(0)
    left = (a.ckind, a.col.subst({PC: x}) if a.col is not None else None)
    right = (b.ckind, b.col.subst({PC: x})) if t and b.col is not None else (b.rkind, b.row.subst({PR: x}))
    if left != right:
        raise proof.wrong(
            op,
            f"it sums {proof.name(op.ins[0])}'s {a.ckind} tiles {form_text(left[1])} times {proof.name(op.ins[1])}'s"
            f" {right[0]} tiles {form_text(right[1])}: a product over unlike tiles",
        )
    if left[0] == "d" and (left[1] != x or blk.ibw != proof.dt):
        raise proof.wrong(op, f"it sums head_dim tiles {form_text(left[1])}, not all {proof.dt} of a row")
    cols = (b.rkind, pin(b.row.subst({PR: Aff.of(PC)}), blk.osh, blk.osw)) if t else (b.ckind, b.col)
    geom = Geom(blk.osh, blk.osw, a.rkind, a.row, cols[0], cols[1])
    value, had = proof.acc(op, op.acc)
    product = ("mm", proof.page(op, op.ins[0]).value, proof.page(op, op.ins[1]).value)
    proof.put(op, op.acc, product if value == ACQUIRED else ("add", value, product), geom, had)


def row_reduce(proof: Proof, op: Compute) -> None:
    """A page's rows reduced (max, sum) into an accumulator, over every key the mask keeps."""
    rr = op.op
    assert isinstance(rr, RowReduce) and op.acc is not None
    x = proof.page(op, op.ins[0])
    g = x.geom
    if g.ckind != "key" or rr.width != g.width or g.col != pin(addr(rr.at, proof.env) + Aff.of(PC), g.rows, g.width):
        raise proof.wrong(op, f"it reduces columns at {addr(rr.at, proof.env).text()} of a page holding {geom_text(g)}")
    if rr.cols < proof.op.seq_kv:
        raise proof.wrong(
            op, f"it reduces the keys below {rr.cols}, hiding keys {rr.cols}..{proof.op.seq_kv - 1} the mask keeps"
        )
    value, had = proof.acc(op, op.acc)
    part = ("rowred", rr.op, x.value)
    proof.put(op, op.acc, part if value == ACQUIRED else ("combine", rr.op, value, part), vector(g), had)


def scale(proof: Proof, op: Compute) -> None:
    """An accumulator rescaled by a page of one value a row of its rows."""
    assert op.acc is not None
    by = proof.page(op, op.ins[0])
    value, had = proof.acc(op, op.acc)
    if had is None or by.geom != vector(had):
        raise proof.wrong(
            op, f"it scales {proof.name(op.acc)} by a page holding {geom_text(by.geom)}, not one value a row"
        )
    proof.put(op, op.acc, ("scale", value, by.value), had, had)


def apply_map(proof: Proof, op: Compute) -> None:
    """A Map's value filled into its reserved page, its pages' tiles lined up element by element."""
    assert isinstance(op.op, Map)
    pages = [proof.page(op, r) for r in op.ins]
    expr = op.op.expr
    whole = {i for i in _args(expr, Arg)}
    geoms = {pages[i].geom for i in whole}
    if len(geoms) > 1:
        raise proof.wrong(op, "it combines pages whose tiles sit at different rows or columns, element by element")
    main = geoms.pop() if geoms else None
    vec = vector(main) if main is not None else None
    for i in _args(expr, RowArg):
        if vec is None:
            vec = pages[i].geom
        if pages[i].geom != vec or pages[i].geom.ckind is not None:
            raise proof.wrong(
                op,
                f"it reads {proof.name(op.ins[i])} as one value a row of pages holding {geom_text(main or vec)}",
            )
    geom = main or vec
    if geom is None:
        raise proof.wrong(op, "its value reads none of its pages")
    proof.fill(op, op.outs[0], Val(value_of(proof, op, expr, pages, geom), geom))


def value_of(proof: Proof, op: Compute, e: Expr, pages: list[Val], geom: Geom) -> Tree:
    """A Map's expression as a tree over its pages' values, on pages laid out as `geom`."""
    match e:
        case Arg(i):
            return pages[i].value
        case RowArg(i, width):
            if width != geom.width:
                raise proof.wrong(op, f"it reads a row vector for pages {width} tiles wide; its pages are {geom.width}")
            return pages[i].value
        case Lit(value):
            return lit(value)
        case Pos(axis, at, width):
            position(proof, op, axis, addr(at, proof.env), width, geom)
            return ("pos", str(axis))
        case Apply(name, args, params):
            return ap(name, *(value_of(proof, op, a, pages, geom) for a in args), params=params)
    raise proof.unsure(op, "the semantic rule follows an attention's maps of their own pages and constants")


def position(proof: Proof, op: Compute, axis: VecAxis, at: Aff, width: int, g: Geom) -> None:
    """A mask's row (column) is the query row (key) of the element it masks."""
    if g.ckind != "key" or g.rkind != "query" or width != g.width:
        raise proof.wrong(op, f"its mask reads positions of pages {width} tiles wide; its page holds {geom_text(g)}")
    have, want = (at + Aff.of(PR), g.row) if axis == VecAxis.ROW else (at + Aff.of(PC), g.col)
    have = pin(have, g.rows, g.width)
    if have != want:
        which = "query row" if axis == VecAxis.ROW else "key"
        raise proof.wrong(
            op, f"its mask's {which} is tile {have.text()}, where the element it masks is at tile {form_text(want)}"
        )


def _args(expr: Expr, kind: type) -> list[int]:
    match expr:
        case Arg(i) | RowArg(i) if isinstance(expr, kind):
            return [i]
        case Apply(_, args):
            return [i for a in args for i in _args(a, kind)]
    return []
