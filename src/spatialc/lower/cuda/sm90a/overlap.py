"""Attention's KV loop in the sm_90a form with one block's softmax overlapping the next block's S (FlashAttention-3's
intra-warpgroup pipelining; `attention.py` prints the rest). The plan's schedule `OVERLAPPED`, the form's default;
`SERIAL` waits for each matmul before the op after it (the form's first schedule, kept as the GPU check's neighbour).

Step j of the loop, with S_j issued by the step before (or before the loop, for j = 0):

    wait until S_j has retired (wait_group 1: P_{j-1}·V_{j-1} may run on), release K_j, copy S_j to registers
    if j + 1 < trip: wait for K_{j+1}, zero S, issue S_{j+1} = Q·K_{j+1}ᵀ           (the tensor cores run it …)
    the softmax of block j, up to the rescale of O                                     (… while this runs)
    if j > 0: wait until P_{j-1}·V_{j-1} has retired (wait_group 1 behind S_{j+1}, 0 on the last step), release
              V_{j-1}
    rescale O, wait for V_j, issue P_j·V_j (A: P_j's fragments, held until that wait)

and after the loop the last P·V is waited for and its V released. S_{j+1} is a second set of S's accumulators
beside S_j's copy (the register ring the softmax reads): a thread's S is 32 float32 registers at 64 keys, which
ptxas -v counts. Every ring is still waited, reserved and released in its program order; what moves is the Wait of
K_{j+1} (before the softmax of block j) and the Pop of V_j (into step j + 1). The producer loads K_j, V_j, K_{j+1},
…: step j's wait for K_{j+1} needs the producer past V_j, whose stage is free once V_{j−D} has been released —
released by step j − D + 1 ≤ j where V's depth D ≥ 2. So V and K two stages deep or more (the planner's 2), else
the schedule is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ....ir.ids import BufferId, LoopVar, loop_var_name
from ....ir.ops import (
    AcquireAcc,
    ChoreoOp,
    Compute,
    Const,
    Loop,
    MatmulTiles,
    Pop,
    ReleaseAcc,
    ScaleAcc,
    Span,
    Wait,
    walk,
)
from ...census import POST, PRE, marker
from ...errors import Unsupported
from ..common.cwriter import span_count

if TYPE_CHECKING:
    from .attention import AttentionPrinter

OVERLAPPED, SERIAL, PINGPONG = "overlapped", "serial", "pingpong"  # (PINGPONG: two warpgroups' turns, pingpong.py)
SCHEDULES = (OVERLAPPED, SERIAL, PINGPONG)
# The widest head_dim the overlapped schedule takes: ptxas -v (nvcc 13, sm_90a) counts 166 registers a thread at
# head_dim 64, 196 at 128 and 255 with 8 bytes of spill at 256 (the serial schedule: 114, 148, 212). The ping-pong's
# too (`pingpong.py`; two consumer warpgroups, ptxas held to the launch's 168 registers a thread: 8 bytes of spill at
# 256, none at 128 or below, none for the serial schedule at 256).
OVERLAP_HEAD_DIM_MAX = 128


@dataclass(frozen=True, slots=True)
class KvStep:
    """The ops of one step of attention's KV loop, in program order, cut where the overlapped schedule moves them."""

    issue_s: tuple[ChoreoOp, ...]  # K's Wait, S's zeroing and S = Q·Kᵀ
    pop_k: Pop
    copy: tuple[ChoreoOp, ...]  # S into its register ring, up to the release of S's accumulators
    softmax: tuple[ChoreoOp, ...]  # up to the first op on O
    rescale: tuple[ChoreoOp, ...]  # from the rescale of O to V's Wait
    pv: Compute
    pop_v: Pop
    rest: tuple[ChoreoOp, ...]  # the register rings' releases after P·V
    s_acc: BufferId
    o_acc: BufferId


def kv_step(loop: Loop) -> KvStep | None:
    """The step of `loop` if it is attention's KV loop as the schedule writes it, else None."""
    body = loop.body
    mms = [i for i, op in enumerate(body) if isinstance(op, Compute) and isinstance(op.op, MatmulTiles)]
    if len(mms) != 2 or not isinstance(loop.count, Const | Span):
        return None
    s_at, pv_at = mms
    s, pv = body[s_at], body[pv_at]
    assert isinstance(s, Compute) and isinstance(pv, Compute)
    if s.acc is None or pv.acc is None or not all(isinstance(op, Wait | AcquireAcc) for op in body[:s_at]):
        return None
    pop_k = body[s_at + 1]
    released = [i for i, op in enumerate(body) if isinstance(op, ReleaseAcc) and op.buf == s.acc]
    on_o = [i for i, op in enumerate(body) if isinstance(op, Compute) and op.acc == pv.acc]
    rescale = body[on_o[0]] if on_o else None
    if not isinstance(pop_k, Pop) or pop_k.buf != s.ins[1] or len(released) != 1 or not on_o:
        return None
    pop_v = body[pv_at + 1] if pv_at + 1 < len(body) else None
    if (
        not isinstance(pop_v, Pop)
        or pop_v.buf != pv.ins[1]
        or not (isinstance(rescale, Compute) and isinstance(rescale.op, ScaleAcc))
    ):
        return None
    if not s_at + 1 < released[0] < on_o[0] < pv_at:
        return None
    return KvStep(
        issue_s=body[: s_at + 1],
        pop_k=pop_k,
        copy=body[s_at + 2 : released[0] + 1],
        softmax=body[released[0] + 1 : on_o[0]],
        rescale=body[on_o[0] : pv_at],
        pv=pv,
        pop_v=pop_v,
        rest=body[pv_at + 2 :],
        s_acc=s.acc,
        o_acc=pv.acc,
    )


def least_trip(loop: Loop) -> int:
    """The fewest steps `loop` runs for any item: its count, or a Span's at the item coordinates' least (0 where a
    step's stride is negative: not worked out)."""
    count = loop.count
    if isinstance(count, Const):
        return count.n
    if not isinstance(count, Span) or any(stride < 0 for _, stride in count.steps):
        return 0
    return min(count.bound, max(0, -(-count.base // count.per)))


def kv_loops(ops: tuple[ChoreoOp, ...]) -> list[Loop]:
    """Attention's KV loops among `ops` (walked)."""
    return [op for op in walk(ops) if isinstance(op, Loop) and kv_step(op) is not None]


def check_depths(pr: AttentionPrinter, step: KvStep) -> None:
    """K's and V's rings at least two stages deep (the module's docstring: the producer must get past V_j)."""
    for buf in (step.pop_k.buf, step.pop_v.buf):
        ring = pr.kept(buf)
        if ring.depth < 2:
            raise Unsupported(
                f"the overlapped attention schedule with {ring.name} {ring.depth} stage deep",
                "it waits for the next K before releasing this V: give K and V two stages (depth=2), or lower"
                " with schedule='serial'",
            )


def overlapped_loop(pr: AttentionPrinter, loop: Loop, step: KvStep, env: dict[LoopVar, str], mark: str) -> None:
    """The KV loop with the softmax of each block overlapping the next block's S (the module's docstring)."""
    check_depths(pr, step)
    if least_trip(loop) < 1:  # (make_attention_kernel chose it so, or refused)
        raise Unsupported("the overlapped attention schedule with items of no KV block", "schedule='serial'")
    w = pr.w
    with w.block():
        v, s, o, keys, trip = loop_frame(pr, loop, step, env)
        # Every item runs a step or more (`least_trip`): no branch around a wgmma, which ptxas would take for a
        # divergent path and serialise them (C7518).
        with w.block("", "// the first block's S, before the loop: each step issues the next one's"):
            with retagged(pr, PRE):
                pr.ops(step.issue_s, env | {loop.var: "0"})
            w.line("spatialc_wgmma_wait<0>();  // (nothing to overlap it with)")
        # Every step but the last issues the next S, and each waits in the same places for as many groups: ptxas
        # serialises the wgmma where a path could read their registers in flight, and a wgmma issued on one branch
        # of a step and not the other is such a path. The last step is printed after the loop (its `post` copy).
        with w.block(f"for (int {v} = 0; {v} + 1 < {trip}; ++{v})", mark):
            inner = env | {loop.var: v}
            _softmax_step(pr, step, inner, v, s, o, keys, True)
        with w.block("", "// the last block: no next S"):
            w.line(f"const int {v} = {trip} - 1;")
            with retagged(pr, POST):
                _softmax_step(pr, step, env | {loop.var: v}, v, s, o, keys, False)
            w.line("spatialc_wgmma_wait<0>();  // the last block's P·V")
            w.line(f"spatialc_acc_fence({o});  // O is whole: nothing reads it before")
            pin(pr, keys)
            pr.release(step.pop_v, marker(step.pop_v, POST))


def loop_frame(
    pr: AttentionPrinter, loop: Loop, step: KvStep, env: dict[LoopVar, str]
) -> tuple[str, str, str, int, str]:
    """What both KV-loop schedules open with, printed inside their block: the trip count (a span's computed), and P's
    A fragments; their names — the loop variable, S's and O's accumulators, keys a block, the trip."""
    w = pr.w
    v = loop_var_name(loop.var)
    s = pr.k.layers[pr.k.rings.template[step.s_acc]].name
    o = pr.k.layers[pr.k.rings.template[step.o_acc]].name
    keys = step.pv.op.block.ibw  # type: ignore[union-attr]
    if isinstance(loop.count, Span):
        for line in span_count(loop.count, env, f"trip_{v}"):
            w.line(line)
        trip = f"trip_{v}"
    else:
        trip = str(loop.count.n)  # type: ignore[union-attr]
    w.line(f"spatialc_frag<OPT> af[{keys}];  // P of each 16 keys, P·V's A: held until its group retires")
    return v, s, o, keys, trip


def _softmax_step(
    pr: AttentionPrinter, step: KvStep, env: dict[LoopVar, str], v: str, s: str, o: str, keys: int, next_s: bool
) -> None:
    """One step of the KV loop, the next block's S issued during its softmax where `next_s`."""
    w = pr.w
    w.line("spatialc_wgmma_wait<1>();  // S of this block has retired; P·V of the one before may run on")
    w.line(f"spatialc_acc_fence({s});  // nothing reads S before the wait")
    pr.ops((step.pop_k, *step.copy), env)
    if next_s:
        w.line("// the next block's S: the tensor cores run it during this block's softmax")
        pr.ops(step.issue_s, env)
    pr.ops(step.softmax, env)
    # wait_group 0, not 1 behind the next S: ptxas serialises every wgmma (C7514) where O's rescale follows a wait
    # that leaves S in flight. The next S has had the softmax's time.
    w.line("spatialc_wgmma_wait<0>();  // P·V of the block before has retired" + (", and the next S" if next_s else ""))
    w.line(f"spatialc_acc_fence({o});  // nothing reads O before the wait")
    pin(pr, keys)
    with w.block(f"if ({v} > 0)", "// and its V goes back"):
        pr.release(step.pop_v, marker(step.pop_v))
    pr.ops((*step.rescale, step.pv, *step.rest), env)


def pin(pr: AttentionPrinter, keys: int) -> None:
    """P's fragments kept in their registers up to the wait that retires the P·V reading them."""
    with pr.unrolled(f"for (int kk = 0; kk < {keys}; ++kk)"):
        pr.w.line("spatialc_frag_fence(af[kk]);  // read by the retired P·V: held until here")


class retagged:
    """The lines printed within carry `tag`'s markers (`pre`: the copy of an op printed before its loop)."""

    def __init__(self, pr: AttentionPrinter, tag: str):
        self.w, self.tag = pr.w, tag

    def __enter__(self) -> None:
        self.start = len(self.w.lines)

    def __exit__(self, *exc: object) -> None:
        lines = self.w.lines
        lines[self.start :] = [line.replace("// op:", f"// {self.tag}:") for line in lines[self.start :]]
