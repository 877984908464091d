"""verify's rule 8 for attention: the schedule runs the online softmax recurrence the declaration `attention(Q, K, V)`
stands for (docs/verification.md, "Attention: the online recurrence").

The declaration is first held to its tensors (`_declared`): the proof's mask reads seq_q and seq_kv from it, the
declared function its rows from the tensors. The proof is then one symbolic run of each distinct site's engines,
as rule 8 proves a GEMM: a loop's variable is a symbol over its iterations, an item's coordinates are symbols over
the grid (`symbolic.Aff`), and no item, head or KV block is enumerated. Pages hold values — trees over the atoms
Q, K and V (the reader's pages, checked against the item's band of query rows at the right head and the KV loop's
block of the right KV head) — and carry where their tiles sit: the query tile row of each page row, the key (or
head_dim) tile of each page column. The KV loop's body is run once from opaque states m, l, o (the loop-entry
accumulators); it must leave them as one step of the recurrence

    m′ = max(m, rowmax(X)),  α = exp(m − m′),  P = exp(X − m′),  l′ = α·l + rowsum(P),  o′ = α·o + P·V,
    X = mask(keep(r, c), scale · Q·Kᵀ),

the same m′ in P and α, tree for tree (one canonical form: a reordering that means the same is refused). Before the
loop m, l and o are freshly acquired (an accumulator's acquire is its reduction's identity: −∞ for a max, 0 for a
sum or a matmul), the loop covers the key tile rows 0, 1, … of its KV head one to one in order (a causal band's
loop, counted per item, at least the keys its rows keep: `enough`), and after it the
writer receives O = o / l and LSE = m + log l at the item's own rows of its own query head, every row of both
written once. Anything else is a SemanticError naming the op and what differs; a schedule whose shape the run does
not follow is StrongerCheckNeeded.

The run is split by what it follows: its state and errors (`attention_state`), the pages between the engines — the
reader's each Wait receives, the KV blocks' keys, the writer's rows (`attention_pages`) — the compute engine's loops
and ring moves (`attention_run`) and its ops' values (`attention_ops`), over the values and the template of
`recurrence`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...arguments import OUTPUT_CHOICES
from ...errors import ProgramError, SemanticError
from ...ir.ids import TensorId
from ...ir.index import ProgramIndex
from ...ir.nodes import ComputeStage, EngineProgram, SpatialProgram, TensorRole
from ...ir.ops import Attention, Const, WriteTiles
from ...numerics.attention import FLOAT32_HOLDS, keyless, valid_scale
from .attention_pages import reader_page, write
from .attention_run import compute
from .attention_state import Proof, nested
from .facts import Programs

if TYPE_CHECKING:
    from ..attention import AttentionShape


def check_attention(index: ProgramIndex, programs: Programs) -> None:
    """Rule 8 for an attention program: each distinct site's engines prove the recurrence (module docstring)."""
    from ..attention import attention_shape  # (passes/attention imports verify through the planner's modules)

    p = index.p
    try:
        shape = attention_shape(p)
    except ProgramError as e:
        raise SemanticError(str(e)) from None
    _declared(p, shape)
    items = dict(p.placement.items_of_site)  # type: ignore[union-attr]
    proved: set[tuple[object, ...]] = set()  # sites running the same programs are proved once, by one holding items
    for site in sorted(programs.by_site):
        by_engine = {q.engine.value: q for q, _ in programs.by_site[site]}
        if not items.get(site):
            _idle(index, by_engine)
        elif programs.keys[site] not in proved:
            proved.add(programs.keys[site])
            _prove(Proof(index, shape, by_engine))


def check_declaration(p: SpatialProgram) -> None:
    """An attention declaration is one `spatialc.attention` takes (a saved file or a hand-built stage may say
    otherwise): its scale a finite number > 0 (the kernel's bound is of |scale| · |Q|·|K|ᵀ, and softmax of a
    negative scale's scores is not the attention any caller asked for), and its mask leaving each query row a key
    (`keyless`: the recurrence's first block needs one, and a row of none is 0 / 0)."""
    for s in p.stages:
        op = getattr(s.kind, "op", None) if isinstance(s.kind, ComputeStage) else None
        if not isinstance(op, Attention):
            continue
        if not valid_scale(op.scale):
            raise SemanticError(
                f"stage {s.name} declares attention with scale = {op.scale!r}; attention's scale is a finite number"
                f" > 0 (spatialc.attention's; {FLOAT32_HOLDS})"
            )
        why = keyless(op.seq_q, op.seq_kv, op.causal)
        if why is not None:
            raise SemanticError(f"stage {s.name}: {why}")


def _declared(p: SpatialProgram, shape: AttentionShape) -> None:
    """The declaration is the tensors': O and LSE are the program's only outputs, O float (float32, fp16, bf16) and
    LSE float32; Q, K and V hold values of the program's operand type; Q and O seq_q rows of head_dim a query head,
    LSE seq_q rows of one value, K and V seq_kv rows of head_dim a KV head, `group` query heads a KV head. (The
    proof's mask reads seq_q and seq_kv from the declaration, the declared function its rows from the tensors: they
    must agree.)"""
    op = shape.op
    (tq, _), (tk, _), (tv, _) = shape.reads
    (to, _), (tl, _) = shape.writes
    q, k, v, o, lse = (p.tensor(TensorId(t)) for t in (tq, tk, tv, to, tl))
    unwritten = [t.name for t in p.tensors if t.role == TensorRole.OUTPUT and t.id not in (o.id, lse.id)]
    if unwritten:  # (the interpreter would hand it back as it found it; a GPU, as its memory held it)
        raise SemanticError(f"output {unwritten[0]} is written by no stage; attention writes {o.name} and {lse.name}")
    for t, field, n, what in ((q, "seq_q", op.seq_q, "query rows a head"), (k, "seq_kv", op.seq_kv, "keys a KV head")):
        if t.elems[0] != n:
            raise SemanticError(f"attention declares {field} = {n} {what}; {t.name} holds {t.elems[0]}")
    for t, types in ((o, OUTPUT_CHOICES["float"]), (lse, ("float32",))):  # (spatialc.attention's)
        if t.dtype.value not in types:
            raise SemanticError(f"attention writes {t.name} as {' or '.join(types)}, not {t.dtype.value}")
    for t in (q, k, v):  # (the interpreter takes a tensor's tiles as they are, a kernel as the matmul's type)
        if t.dtype.value != p.precision.value:
            raise SemanticError(
                f"tensor {t.name} holds {t.dtype.value} values, but attention's matmuls read {p.precision.value}"
            )
    d = q.elems[1]
    for t, want in ((k, (op.seq_kv, d)), (v, (op.seq_kv, d)), (o, (op.seq_q, d)), (lse, (op.seq_q, 1))):
        if t.elems != want:
            raise SemanticError(
                f"attention declares over {q.name} of {op.seq_q}x{d} elements a head; {t.name} holds"
                f" {t.elems[0]}x{t.elems[1]} elements a head, not {want[0]}x{want[1]}"
            )
    for t, per in ((k, op.group), (v, op.group), (o, 1), (lse, 1)):
        if t.groups * per != q.groups:
            raise SemanticError(
                f"attention declares {op.group} query heads a KV head over {q.name}'s {q.groups}; {t.name} holds"
                f" {t.groups} heads"
            )


def _idle(index: ProgramIndex, progs: dict[str, EngineProgram]) -> None:
    """A site holding no item writes nothing (its ITEM loop, if any, runs no iteration)."""
    writer = progs.get("writer")
    if writer is None:
        return
    for op, nest in nested(writer.ops):
        if isinstance(op, WriteTiles) and all(count != Const(0) for count, _ in nest):
            raise index.at_op(
                SemanticError, writer, op, "the site holds no item, yet writes: every row once, by its item"
            )


def _prove(proof: Proof) -> None:
    """One site's run: the reader's pages found, the compute engine run, the writer's stores matched to its pages."""
    proof.pages = {r: reader_page(proof, r) for r in (proof.q, proof.k, proof.v)}
    compute(proof)
    for ring in (proof.o, proof.lse):
        write(proof, ring)
