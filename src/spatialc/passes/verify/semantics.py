"""verify's rule 8, semantics: the schedule computes what the stages declare.

The stages declare a function: C = e_n(…e_1(A @ B)) for a GEMM whose epilogue stages e_i follow the matmul
(`declared` refuses any other pipeline). The rule proves that running the schedule
gives exactly that, tile by tile: every tile of C is written once, by the item that owns it, with the declared
epilogue — each op equal to its stage's, in stage order, a bias at the tile's own column — applied to
Σ_k A[i, k]·B[k, j] over every k of K exactly once, A and B in their roles. Along the way: the accumulator is zeroed
before its first product and read only after its last, and no page is read that nothing filled.

How, without enumerating tiles or iterations. Each engine is run once, symbolically: a loop's variable is a symbol
ranging over its iterations, an item's coordinates are symbols over the grid, a tile's place in a block is a pair
of symbols. A ReadTiles fills its page with the formula "tile (row, col) of T", rows and columns affine in those
symbols; a matmul adds "Σ_{k-loop, kk} A-tile × B-tile" to its accumulator; PackAcc and the epilogue ops wrap the
formula; the WriteTiles finally says which tile of C receives which formula. Pages travel through rings in FIFO
order: the n-th page a producer reserves is the n-th page its consumer pops, and since rules 3–5 have shown every
ring to have one producer and one consumer that move equal pages per co-iterating loop, a page's position is an
affine form in the loops around its Reserve (and around the consumer's read), which is matched loop for loop. At
the write, the proof is a handful of comparisons of affine forms: the A tile's row is the C tile's row, the B tile's
column is its column, A's k-tile is B's, the k-tiles run one to one over 0..N-1 (a mixed-radix check on their
coefficients), and the write's (row, column) run one to one over each item's block. Together with rule 2 (every
item on exactly one site, each site's ITEM loop over exactly its items), every tile of C is written exactly once.

What it does not follow — and refuses with StrongerCheckNeeded rather than guess: loops whose trip count is read
from data (the result would depend on the data), multicast (pages crossing sites), a producer and consumer whose
loops around a ring differ in shape, pages whose layout a consumer reads differently, a matmul of two computed
operands.

A matmul may multiply one computed operand — a page an elementwise chain filled from another matmul's accumulator
(an MLP's gelu(X @ W1) @ W2). Its products then hold the computed tile's formula in place of a tensor tile; the
proof takes the k-tile from the tensor operand, shows the k-tiles whole as above, and then proves the computed tile
at (row, k) or (k, column) the way it proves a tile of C: its chain op for op, its own sum over its own K.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from ...errors import SemanticError, StrongerCheckNeeded
from ...ir.ids import BufferId, GroupId, ItemId, SemId, Site
from ...ir.index import ProgramIndex
from ...ir.nodes import ComputeStage, EngineProgram, ReadStage
from ...ir.ops import (
    Attention,
    ChoreoOp,
    Compute,
    Loop,
    Map,
    McastSend,
    McastSetValid,
    ReadTiles,
    SemInc,
    Trip,
    cols,
    rewrite,
    walk,
)
from .attention import check_attention, check_declaration
from .blockscale import check_scale_types
from .dataflow import Declared, SiteRun, Write
from .declared import declared_outputs
from .declared_cols import check_col_semantics, is_col_declared
from .facts import Programs
from .handshake import multicast_senders
from .partials import Workspace, item_values, raises
from .semantics_value import _Proof
from .symbolic import AccSum, Cell, Elem, Partial

# ---- the rule ----------------------------------------------------------------------------------------------------


def check_semantics(index: ProgramIndex, programs: Programs) -> None:
    """Rule 8 for every distinct set of site programs."""
    p = index.p
    check_declaration(p)  # (a declaration's own: the schedule's proof takes its scale and mask as given)
    if p.placement is None or p.schedule is None or p.plan is None:
        check_scale_types(index)
        return  # nothing is computed yet
    for prog in programs.distinct():
        _followable(index, prog)
    if any(isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, Attention) for s in p.stages):
        check_attention(index, programs)  # its own proof: the online recurrence (verify/attention.py)
        return
    if is_col_declared(p):  # a band of columns reduced down its rows: its own proof (verify/declared_cols.py)
        check_col_semantics(index, programs)
        return
    for decl in declared_outputs(index):  # each output proved apart: its own formula, its own writes
        _check_output(index, programs, decl)
    check_scale_types(index)  # (after the products' proofs, whose faults it would otherwise hide: verify/blockscale.py)


def _check_output(index: ProgramIndex, programs: Programs, decl: Declared) -> None:
    """Rule 8 for one output: every site's run, the proof at each of its writes."""
    p = index.p
    assert p.placement is not None and p.schedule is not None
    items = dict(p.placement.items_of_site)
    senders = multicast_senders(index, p.schedule.programs)  # (rule 7 has refused two senders into one ring)
    keys = _keys(programs, senders)
    shared: dict[tuple[object, ...], list[ItemId]] = {}
    for site, key in keys.items():
        shared.setdefault(key, []).extend(items.get(site, ()))
    idle: dict[tuple[object, ...], Site] = {}  # per set of programs, a site that runs it holding no item
    for site in sorted(keys):
        if not items.get(site):
            idle.setdefault(keys[site], site)
    first: dict[tuple[object, ...], Site] = {}
    for site in sorted(keys):
        first.setdefault(keys[site], site)
    made: dict[Site, tuple[SiteRun, list[Write]]] = {}

    def run_of(site: Site, chain: tuple[Site, ...] = ()) -> SiteRun:
        """The site's run, after the runs of the sites that multicast into it."""
        if site not in made:
            if site in chain:
                raise StrongerCheckNeeded(
                    f"sites {', '.join(str(int(s)) for s in chain)} multicast pages to each other in a cycle; the"
                    " semantic rule follows pages sent from a site that read them",
                    site=int(site),
                )
            run = SiteRun(index, decl, site, programs.by_site[site], items.get(site, ()), _sample(shared[keys[site]]))
            run.senders = {ring: run_of(s, (*chain, site)) for ring, s in senders.get(site, {}).items()}
            made[site] = (run, run.run())
        return made[site][0]

    runs: list[tuple[SiteRun, list[Write]]] = []
    for site in first.values():
        run_of(site)
        runs.append(made[site])
    _multicast_items(index, senders, {s: made[first[keys[s]]][0] for s in keys})
    if decl.out.groups > 1:
        _grouped_reads(index, decl, [w for _, ws in runs for w in ws])
    space, counts = None, Counter[tuple[Site, SemId]]()
    if decl.split is not None:
        counts = raises(index)
        classes = {key: tuple(s for s in sorted(keys) if keys[s] == key) for key in shared}
        space = Workspace(index, [(run, classes[keys[run.site]]) for run, _ in runs])
        _one_writer_per_item(index, keys, runs)
    for run, write in ((run, w) for run, ws in runs for w in ws):
        other = idle.get(keys[run.site])
        if other is not None:  # it runs the same programs, so it writes the same tiles again
            raise SemanticError(
                f"{write.head} — site {int(other)} holds no item, yet runs site {int(run.site)}'s programs, which write"
                f" {decl.out.name}: each tile is written once, by the site that holds its item",
                site=int(other),
                engine=write.engine,
                op=index.op(write.op),
                buffer=index.buffer_of(write.op),
            )
        if space is None or not _has_partials(write.cell):
            _Proof(run, write).check()
            continue
        # A split owner: its sum is completed by other sites' partials, found item by item.
        _Proof(run, write).coverage()
        _Proof(run, write).rows()
        for site in sorted(s for s in keys if keys[s] == keys[run.site]):
            for item in write.items(items.get(site, ())):
                values = item_values(run, write.item, item)
                fixed = dataclasses.replace(
                    write, row=write.row.subst(values), col=write.col.subst(values), cell=write.cell.subst(values)
                )
                _Proof(run, fixed, space, site, counts).value(fixed.cell, decl.last)


def _grouped_reads(index: ProgramIndex, decl, writes: list[Write]) -> None:
    """A grouped output's row counts are one tensor, which no stage reads: every loop counted at run time counts
    rows with the writes' own count (`_Proof.rows` checks it there), every read of A masks its rows with it, and no
    other read masks anything. (Without these a count, or a mask, taken from another tensor — a bias — would pass
    the proof at the write unseen.)"""
    masks = {w.op.rows_from for w in writes}
    if None in masks:
        return  # `_Proof.rows` refuses an unmasked write by name
    if len(masks) > 1:
        names = ", ".join(sorted(index.tensors[m].name for m in masks if m is not None))
        raise SemanticError(
            f"the output's rows are masked by different tensors at different sites ({names}): a grouped GEMM's row"
            " counts are one tensor"
        )
    (counts,) = masks
    assert counts is not None
    name = index.tensors[counts].name
    for s in index.p.stages:
        op = getattr(s.kind, "op", None)
        reads = (
            {s.kind.tensor}
            if isinstance(s.kind, ReadStage)
            else {c.tensor for c in cols(op.expr)}
            if isinstance(op, Map)
            else set()
        )
        if counts in reads:
            raise SemanticError(
                f"the row counts come from {name}, which stage {s.name} also reads: a grouped GEMM's row counts are a"
                " tensor of their own"
            )
    trips = [t for w in writes for t, _, _ in w.trips]
    if len(set(trips)) > 1:
        raise SemanticError(
            "the output's rows are written in loops counted differently at different sites: a grouped GEMM's rows"
            " are counted one way"
        )
    for prog in index.p.schedule.programs:  # type: ignore[union-attr]
        for op in walk(prog.ops):
            why = None
            if isinstance(op, Loop) and isinstance(op.count, Trip) and trips and op.count != trips[0]:
                t = trips[0]
                shown = f"ceil({index.tensors[t.tensor].name}[…] / {t.per}), at most {t.bound}"
                why = f"its count is not the one the output's rows are written by ({shown})"
            elif isinstance(op, ReadTiles) and op.tensor == decl.a and op.rows_from != counts:
                why = f"it reads {index.tensors[op.tensor].name}'s rows without masking them with {name}"  # type: ignore[index]
            elif isinstance(op, ReadTiles) and op.tensor != decl.a and op.rows_from is not None:
                why = f"it masks rows of {index.tensors[op.tensor].name}, whose rows are not the output's"
            if why is not None:
                raise index.at_op(SemanticError, prog, op, why)


def _has_partials(cell: Cell) -> bool:
    match cell:
        case Elem(inners=inners):
            return any(_has_partials(c) for c in inners)
        case AccSum(terms):
            return any(isinstance(t, Partial) for t in terms)
    return False


def _keys(programs: Programs, senders: dict[Site, dict[BufferId, Site]]) -> dict[Site, tuple[object, ...]]:
    """Which sites the rule follows as one: those whose programs are the same but for the sites their SemIncs raise
    and the groups they multicast to (which compute nothing; split-K's contributors of one split, each raising its
    own owner; the senders of like multicast groups), and whose senders are alike so. The handshakes are checked
    site by site (`partials.check_handshake`, rule 7), with the concrete programs, and the items of each sender and
    receiver by `_multicast_items`."""
    norm: dict[int, int] = {}
    seen: dict[tuple[ChoreoOp, ...], int] = {}

    def anywhere(op: ChoreoOp) -> ChoreoOp:
        if isinstance(op, SemInc):
            return dataclasses.replace(op, at=Site(0))
        if isinstance(op, McastSend | McastSetValid):
            return dataclasses.replace(op, group=GroupId(0))
        return op

    def strip(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
        return rewrite(ops, anywhere)

    out: dict[Site, tuple[object, ...]] = {}
    for site, progs in programs.listed.items():
        key = []
        for q in progs:
            n = programs.number(q.ops)
            if n not in norm:
                norm[n] = seen.setdefault(strip(q.ops), len(seen))
            key.append((q.engine, norm[n]))
        out[site] = tuple(key)
    # A receiver's pages are its senders' (sorted by ring): its key names theirs, so sites alike receive alike.
    return {site: (*key, *((r, out[s]) for r, s in sorted(senders.get(site, {}).items()))) for site, key in out.items()}


def _multicast_items(index: ProgramIndex, senders: dict[Site, dict[BufferId, Site]], runs: dict[Site, SiteRun]) -> None:
    """A received page holds the tiles of the sender's item (its row of A, its column of B): for every receiver,
    every ring it receives and every item it runs, the sender's item in the same place of its ITEM loop agrees with
    the receiver's in the coordinates the page names. (The run of the receiver's programs followed the page with the
    sender's item coordinates renamed to its own; this is what makes the renaming right.)"""
    p = index.p
    assert p.placement is not None and p.plan is not None
    nx = p.plan.placed[1]
    items = dict(p.placement.items_of_site)
    for site, rings in sorted(senders.items()):
        for ring, sender in sorted(rings.items()):
            coords = runs[site].received.get(ring, set())
            mine, theirs = items.get(site, ()), items.get(sender, ())
            for j, (a, b) in enumerate(zip(mine, theirs, strict=False)):
                (ya, xa), (yb, xb) = divmod(int(a), nx), divmod(int(b), nx)
                wrong = [c for c, u, v in (("item_y", ya, yb), ("item_x", xa, xb)) if c in coords and u != v]
                if wrong:
                    name = "row" if wrong[0] == "item_y" else "column"
                    raise SemanticError(
                        f"site {int(site)}: {index.name(ring)} — its item {j} (y {ya}, x {xa}) receives the pages site"
                        f" {int(sender)} multicasts for its item {j} (y {yb}, x {xb}): tiles of another {name} than"
                        " the item needs",
                        site=int(site),
                        buffer=index.name(ring),
                    )


def _one_writer_per_item(
    index: ProgramIndex, keys: dict[Site, tuple[object, ...]], runs: list[tuple[SiteRun, list[Write]]]
) -> None:
    """With items on several sites (split-K), exactly one of them writes each item's block of the output."""
    p = index.p
    assert p.placement is not None
    writing = {keys[run.site]: ws for run, ws in runs if ws}
    by_item: dict[ItemId, list[Site]] = {}
    for site, items in p.placement.items_of_site:
        for w in writing.get(keys.get(site), ()):  # type: ignore[arg-type]
            for item in w.items(items):
                by_item.setdefault(item, []).append(site)
    nx = p.plan.grid[1]  # type: ignore[union-attr]
    for i in range(p.plan.items):  # type: ignore[union-attr]
        item = ItemId(i)
        sites = by_item.get(item, [])
        if len(sites) != 1:
            who = f"sites {', '.join(str(int(s)) for s in sites)}" if sites else "no site"
            raise SemanticError(
                f"item {item} (y {item // nx}, x {item % nx}) is written to {index.p.output_tensor().name} by"  # type: ignore[union-attr]
                f" {who}; of the sites an item is split over, exactly one adds up the partial sums and writes it",
                site=int(sites[-1]) if sites else None,
            )


def _sample(items: list[ItemId], n: int = 16) -> tuple[ItemId, ...]:
    """Up to n items spread over `items` (sorted), first and last among them: the witnesses a message may name."""
    items = sorted(items)
    if len(items) <= n:
        return tuple(items)
    return tuple(items[i * (len(items) - 1) // (n - 1)] for i in range(n))


def _followable(index: ProgramIndex, prog: EngineProgram) -> None:
    """Refuse what the rule cannot follow, before following anything."""
    for op in walk(prog.ops):
        why = None
        if isinstance(op, Loop) and isinstance(op.count, Trip) and index.p.plan.groups == 1:  # type: ignore[union-attr]
            why = (
                "its trip count is read from data, so what the program computes would depend on the data; the"
                " semantic rule proves a fixed function of the inputs, or a grouped GEMM's rows counted at run time"
            )
        elif isinstance(op, Compute) and op.acc_reload is not None:
            why = "the semantic rule does not follow an accumulator spilled to a ring and reloaded"
        if why is not None:
            raise index.at_op(StrongerCheckNeeded, prog, op, why)
