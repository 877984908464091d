"""The interpreted machine: the program's state, created on first use, and the engines compiled against it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..ir.ids import LV_ITEM_X, LV_ITEM_Y, BufferId, GroupId, LoopVar, SemId, Site, TensorId
from ..ir.nodes import Accumulator, Buffer, Fifo, Interm, SpatialProgram
from ..ir.ops import ChoreoOp, Compute, Loop, PackAcc, ReadTiles, Trip, WriteTiles, walk
from ..ir.printer import op_text
from .codegen import Code, Emitter, Ref
from .errors import EvalError, TripError
from .state import Acc, BarrierState, EngineState, Ring, SemCell
from .trace import Recorder, Trace
from .values import LaterRows, Store

Where = Callable[[], str]  # the place a lookup is asked from, formatted only when it fails


class Machine:
    """Rings, accumulators, semaphores and barriers of every site, keyed by site; tensors by id."""

    def __init__(
        self, p: SpatialProgram, stores: dict[TensorId, Store], params: dict[TensorId, np.ndarray], tracing: bool
    ) -> None:
        assert p.placement is not None and p.schedule is not None
        self.p, self.stores, self.params = p, stores, params
        self.recorder = Recorder() if tracing else None
        self.later = LaterRows()  # the row values the engines made, not computed yet (`rowpacks.realise_packs`)
        self.items_of = dict(p.placement.items_of_site)
        self.groups = {g.id: g.sites for g in p.placement.groups}
        self.buffers = {b.id: b for b in p.buffers}
        self.semaphores = {s.id: s for s in p.semaphores}
        self.rings: dict[tuple[Site, BufferId], Ring] = {}
        self.accs: dict[tuple[Site, BufferId], Acc] = {}
        self.sem_cells: dict[tuple[Site, SemId], SemCell] = {}
        self.barriers: dict[GroupId, BarrierState] = {}
        self._offsets: dict[tuple[int, int, int, int], np.ndarray] = {}
        self._texts: dict[ChoreoOp, str] = {}
        self._slots = {v: i for i, v in enumerate(_loop_vars(p))}
        self._sides: dict[tuple[int, str], EngineState] = {}
        self._ring_shapes: dict[BufferId, tuple[str, int, int, str]] = {}  # by template: name, depth, page, layout
        # Rings whose pages hold computed values (a pack's, an elementwise stage's): a matmul rounds those to its
        # operand type (`support.operand`), and takes a tensor's tiles as they are.
        self.computed = {
            p.buffer(b).ring
            for ops in {id(prog.ops): prog.ops for prog in p.schedule.programs}.values()  # (sites share ops tuples)
            for op in walk(ops)
            for b in (op.outs if isinstance(op, Compute) else (op.to,) if isinstance(op, PackAcc) else ())
        }

    def engines(self) -> list[tuple[EngineState, Iterator[int | None]]]:
        """Every engine program of every site as (state, run generator), in schedule order. Sites that run the
        same ops share one compiled Code."""
        assert self.p.schedule is not None
        codes: dict[tuple[ChoreoOp, ...], Code] = {}
        by_id: dict[int, Code] = {}  # schedules share one ops tuple among sites: skip hashing it again
        out = []
        for prog in self.p.schedule.programs:
            eng = EngineState(prog.site, prog.engine, self, self.recorder)
            code = by_id.get(id(prog.ops))
            if code is None:
                if prog.ops not in codes:
                    codes[prog.ops] = Emitter(self, eng.label, self.recorder is not None).compile(prog.ops)
                code = by_id[id(prog.ops)] = codes[prog.ops]
            out.append((eng, self.bind(eng, code)))
        return out

    def bind(self, eng: EngineState, code: Code) -> Iterator[int | None]:
        """The engine's run: its code applied to its site's state."""
        site = eng.site
        items = self.items_of.get(site, ())
        if code.item_coords_free and len(items) != 1:
            raise EvalError(
                f"{eng.label} uses item_y / item_x outside an ITEM loop, and site {int(site)} has"
                f" {len(items)} items, not one"
            )
        nx = self.grid_nx() if items else 1
        coords = [divmod(int(it), nx) for it in items]
        eng.code, eng.args = code, [self._resolve(eng, ref) for ref in code.refs]
        for pos, side in code.sides:
            ring = eng.args[pos]
            assert isinstance(ring, Ring)
            other = self._sides.setdefault((id(ring), side), eng)
            if other is not eng:
                raise EvalError(
                    f"{ring.name} at site {int(site)} has two {side}r engines, {other.engine.value} and"
                    f" {eng.engine.value}: a ring has one producer and one consumer"
                )
        return code.fn(eng, coords, *eng.args)

    def _resolve(self, eng: EngineState, ref: Ref) -> object:
        site = eng.site
        match ref:
            case ("ring", bid):
                return self.ring(site, self.buffers[bid])
            case ("acc", bid):
                return self.acc(site, self.buffers[bid])
            case ("sem", sid, at):
                return self.sem(site if at is None else at, sid)
            case ("sem_group", sid, gid):
                return [self.sem(s, sid) for s in self.groups[gid]]
            case ("ring_group", bid, gid):
                return [self.ring(s, self.buffers[bid]) for s in self.groups[gid] if s != site]
            case ("barrier", gid):
                if site not in self.groups[gid]:
                    raise EvalError(f"{eng.label}: a Barrier of group {int(gid)}, which site {int(site)} is not in")
                return self.barrier(gid)
        raise AssertionError(f"unknown state reference {ref!r}")

    def trace(self) -> Trace:
        assert self.recorder is not None
        return self.recorder.finish(list(self.rings.values()))

    # ---- lookups, each failing with the place it was asked from ---------------------------------------------

    def text(self, op: ChoreoOp) -> str:
        """The op as `op_text` prints it (cached: equal ops print alike)."""
        if op not in self._texts:
            self._texts[op] = op_text(self.p, op)
        return self._texts[op]

    def slot(self, var: LoopVar) -> int:
        return self._slots[var]

    def grid_nx(self) -> int:
        plan = self.p.plan
        if plan is None:
            raise EvalError(
                f"item coordinates need a program with exactly one plan; {self.p.name} has {len(self.p.plans)}"
            )
        return plan.grid[1]

    def offsets(self, bh: int, bw: int, sh: int, sw: int) -> np.ndarray:
        """Tile offsets bh'·sh + bw'·sw of a block, slot order; shared so equal blocks compare by identity."""
        key = (bh, bw, sh, sw)
        if key not in self._offsets:
            self._offsets[key] = (np.arange(bh)[:, None] * sh + np.arange(bw)[None, :] * sw).reshape(-1)
        return self._offsets[key]

    def buffer(self, bid: BufferId, where: Where) -> Buffer:
        if bid not in self.buffers:
            raise EvalError(f"{where()}: the program has no buffer {int(bid)}")
        return self.buffers[bid]

    def store(self, tid: TensorId, where: Where) -> Store:
        if tid not in self.stores:
            raise EvalError(f"{where()}: the program has no tensor {int(tid)}")
        return self.stores[tid]

    def ring_kind(self, bid: BufferId) -> Fifo | Interm:
        """The shape of the ring buffer `bid` is (a copy of): its template's, when the program lists it."""
        buf = self.buffers[bid]
        kind = self.buffers[buf.ring].kind if buf.ring in self.buffers else buf.kind
        assert isinstance(kind, Fifo | Interm)
        return kind

    def ring(self, site: Site, buf: Buffer) -> Ring:
        """Site's state of the ring `buf` is (a copy of): per-site copies of one template are one ring per site."""
        key = (site, buf.ring)
        if key not in self.rings:
            shape = self._ring_shapes.get(buf.ring)
            if shape is None:
                kind = self.ring_kind(buf.id)
                name = self.buffers[buf.ring].name if buf.ring in self.buffers else buf.name
                shape = (name, kind.depth_pages, kind.page_tiles, kind.layout.value)
                if buf.ring in self.buffers:  # a listed template's: found once, not once a site
                    self._ring_shapes[buf.ring] = shape
            name, depth, page, layout = shape
            self.rings[key] = Ring(name, site, depth, page, self.recorder is not None, layout)
        return self.rings[key]

    def acc(self, site: Site, buf: Buffer) -> Acc:
        key = (site, buf.id)
        if key not in self.accs:
            assert isinstance(buf.kind, Accumulator)
            self.accs[key] = Acc(buf.name, buf.kind.tiles)
        return self.accs[key]

    def check_sem(self, sid: SemId, site: Site | None, where: Where) -> None:
        """A semaphore the program declares, on a site the placement has (None: the engine's own)."""
        if sid not in self.semaphores:
            raise EvalError(f"{where()}: the program has no semaphore {int(sid)}")
        if site is not None and site not in self.items_of:
            raise EvalError(f"{where()}: there is no site {int(site)}")

    def sem(self, site: Site, sid: SemId) -> SemCell:
        key = (site, sid)
        if key not in self.sem_cells:
            s = self.semaphores[sid]
            self.sem_cells[key] = SemCell(s.name, s.initial)
        return self.sem_cells[key]

    def group(self, gid: GroupId, where: Where) -> tuple[Site, ...]:
        if gid not in self.groups:
            raise EvalError(f"{where()}: the placement has no group {int(gid)}")
        return self.groups[gid]

    def barrier(self, gid: GroupId) -> BarrierState:
        if gid not in self.barriers:
            self.barriers[gid] = BarrierState(self.groups[gid])
        return self.barriers[gid]

    def trip(self, trip: Trip, where: Where, iy: int = 0, ix: int = 0) -> int:
        """A data-dependent loop count: ceil(v / per) for v the element `index + Σ stride·(item_y | item_x)`
        (row-major) of a parameter tensor, 0..bound."""
        if trip.tensor not in self.params:
            raise TripError(f"{where()}: the trip count's tensor {int(trip.tensor)} is not an input or parameter")
        values = self.params[trip.tensor]
        at = trip.index + sum(stride * (iy if var == LV_ITEM_Y else ix) for var, stride in trip.steps)
        if not 0 <= at < values.size:
            raise TripError(f"{where()}: element {at} is outside a tensor of {values.size} elements")
        v = float(values[at])
        count = -(-int(v) // trip.per) if v == int(v) else -1
        if count < 0 or count > trip.bound:
            shown = f"{v:g}" if trip.per == 1 else f"ceil({v:g} / {trip.per})"
            raise TripError(f"{where()}: the trip count is {shown}, not a whole number in 0..{trip.bound}")
        return count

    def row_counts(self, tid: TensorId, where: Where) -> np.ndarray:
        """A grouped tensor's row counts: the values of parameter tensor `tid`, one per group."""
        if tid not in self.params:
            raise TripError(f"{where()}: the row counts' tensor {int(tid)} is not an input or parameter")
        return self.params[tid]


def _loop_vars(p: SpatialProgram) -> list[LoopVar]:
    """Every loop variable the schedule binds or reads, item coordinates first."""
    found: dict[LoopVar, None] = {LV_ITEM_Y: None, LV_ITEM_X: None}
    assert p.schedule is not None
    for ops in {id(prog.ops): prog.ops for prog in p.schedule.programs}.values():
        for op in walk(ops):
            match op:
                case Loop(var=var):
                    found[var] = None
                case ReadTiles(at=at) | WriteTiles(at=at):
                    found.update((v, None) for v, _ in at.steps)
    return list(found)


def written_tensors(p: SpatialProgram) -> set[TensorId]:
    """Tensors some WriteTiles writes (their reads must copy; every other tensor is read by reference)."""
    assert p.schedule is not None
    distinct = {id(prog.ops): prog.ops for prog in p.schedule.programs}.values()
    return {op.tensor for ops in distinct for op in walk(ops) if isinstance(op, WriteTiles)}
