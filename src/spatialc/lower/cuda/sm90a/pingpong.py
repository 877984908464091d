"""Attention's KV loop in the sm_90a form with FlashAttention-3's ping-pong: the two consumer warpgroups of a band
of 128 rows take turns issuing their matmuls, so that one's softmax runs while the tensor cores run the other's
(`attention.py` prints the rest). The schedule `PINGPONG`, the default where a band has two consumer warpgroups.

The turns are two named barriers (`pingpong.cuh`), one a warpgroup, each counting both warpgroups' threads: a
warpgroup waits on its own (bar.sync) before it issues, and once its matmuls are issued arrives on the other's
without waiting (bar.arrive). Warpgroup 0 arrives on its own barrier once before its first item, so that the first
turn is its; both warpgroups run the same items and KV steps, so their turns alternate to the end, where warpgroup 1's
last arrival is left on warpgroup 0's barrier (the block's barriers go with it).

Inside a warpgroup the order is FlashAttention-3's: a turn issues this block's S = Q·Kᵀ and the block before's P·V
together, and the softmax of this block runs after the turn, during the P·V (and the other warpgroup's turn). Step j
of the loop (j ≥ 1), with the softmax of block j − 1 done by the step before (or before the loop, for j = 1):

    wait for V_{j−1}, wait for K_j
    wait for this warpgroup's turn
    rescale O; zero S, issue S_j; issue P_{j−1}·V_{j−1} (A: P's fragments)
    arrive on the other warpgroup's barrier: its turn
    wait until S_j has retired (wait_group 1: P·V runs on), release K_j, copy S_j to registers
    the softmax of block j, up to the rescale of O                               (… during P·V and the other's turn)
    wait until P_{j−1}·V_{j−1} has retired (wait_group 0), release V_{j−1}

before the loop block 0's S in a turn of its own (K_0 waited for before it) and its softmax, after it block
(trip − 1)'s P·V in a turn of its own (its V waited for before it). Every ring is waited, reserved and released in
its program order, as in the overlapped schedule (`overlap.py`).

The stages are waited for before the turn, as FlashAttention-3 waits for K before its scheduler barrier: a turn
holds the tensor cores for the other warpgroup, and a turn blocked on a TMA load would hold them idle. V_{j−1} is
waited for there too (FlashAttention-3 waits for V inside the turn, after issuing S): the producer lands V_{j−1}
before K_j, so once K_j is there V_{j−1} almost always is, and the turn then issues without a wait in it. Waiting
earlier cannot order anything wrongly (it only delays this warpgroup); the question is whether it can deadlock, and
it cannot, at any depth of K and V, one stage included. Warpgroup A's waits before its turn j need the producer past
V_{j−1} and K_j, that is, both warpgroups' releases of K_{j−D} and V_{j−1−D} (D: the rings' depth), the latest,
at D = 1, K_{j−1} and V_{j−2}. A released its own in its step j − 1. Warpgroup B releases K_{j−1} after its turn
j − 1 and V_{j−2} at the end of its step j − 1; its turn j − 1 needs A's arrival from A's turn j − 1, made before A
reached these waits, and B's own waits before that turn need releases of step j − 2, made before; nothing B needs
waits on A's step j. So the chain of what each wait needs runs back to earlier steps and never round to itself:
no cycle, as the emulation of the depth-1 case (tests/lower/test_sm90a_attention.py) runs it. The same holds for
block 0's turn (K_0 needs the item before's last K released by both warpgroups, which each did once that K's S had
retired, before its last turn of that item) and for the last P·V's (its V needs the V before released by both, at
the end of their last steps, which need only earlier turns). The rescale of O stays in the turn, where
FlashAttention-3 has it.

Unlike the overlapped schedule the ping-pong takes K and V one stage deep (emulated so; the default still asks for
two stages). Every item must run a KV step (block 0's S is issued before the loop). No second set of S registers is
live during a softmax: S is copied out before the softmax, and the next S is issued only after it; ptxas still
spills above head_dim 128 (`attention.py` refuses it there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ....ir.ids import LoopVar
from ....ir.ops import ChoreoOp, Loop, Wait
from ...census import POST, PRE, marker
from ...errors import Unsupported
from .overlap import KvStep, least_trip, loop_frame, pin, retagged
from .plan import WARPGROUP

if TYPE_CHECKING:
    from .attention import AttentionPrinter

# The two warpgroups' named barriers: PINGPONG_BARRIER + the warpgroup (after the engines' 1 + their index and the
# staging boxes' 8 and 9, `staging.OUT_BARRIER`; a CTA has 16), each counting both warpgroups' threads. `barriers.py`
# checks every kernel's ids disjoint and within 1 to 15 before it is printed. `barriers.py`
# checks every kernel's ids disjoint and within 1 to 15 before it is printed.
PINGPONG_BARRIER = 10
BOTH_THREADS = 2 * WARPGROUP * 32


def first_turn() -> str:
    """Warpgroup 0's arrival on its own barrier before its first item: the first turn is its."""
    return f"if (warp / {WARPGROUP} == 0) {{ spatialc_engine_arrive({PINGPONG_BARRIER}, {BOTH_THREADS}); }}"


def pingpong_loop(pr: AttentionPrinter, loop: Loop, step: KvStep, env: dict[LoopVar, str], mark: str) -> None:
    """The KV loop with the two warpgroups' matmuls in turns (the module's docstring)."""
    if pr.hk.wg.consumers != 2:  # (make_attention_kernel refused it)
        raise Unsupported("the ping-pong attention schedule with one consumer warpgroup", "schedule='overlapped'")
    if least_trip(loop) < 1:
        raise Unsupported("the ping-pong attention schedule with items of no KV block", "schedule='serial'")
    w = pr.w
    with w.block():
        v, s, o, keys, trip = loop_frame(pr, loop, step, env)
        first = "// block 0's S in a turn of its own, and its softmax: each step issues the next S"
        with w.block("", first), retagged(pr, PRE):
            zero = env | {loop.var: "0"}
            _turn(pr, lambda: pr.ops(issued(step.issue_s), zero), lambda: pr.ops(waits(step.issue_s), zero))
            _softmax(pr, step, zero, s, 0)
        with w.block(f"for (int {v} = 1; {v} < {trip}; ++{v})", mark):
            before = env | {loop.var: f"({v} - 1)"}  # (the rescale and P·V are the block before's)
            here = env | {loop.var: v}

            def wait() -> None:  # V_{j−1}, then K_j: the producer's order
                pr.ops(waits(step.rescale), before)
                pr.ops(waits(step.issue_s), here)

            def issue() -> None:
                pr.ops(issued(step.rescale), before)
                pr.ops(issued(step.issue_s), here)
                pr.ops((step.pv,), before)

            _turn(pr, issue, wait)
            pr.ops(step.rest, before)
            _softmax(pr, step, here, s, 1)
            _retired(pr, step, o, keys, f"{v} - 1", mark)
        with w.block("", "// the last block's P·V in a turn of its own"):
            last = env | {loop.var: f"({trip} - 1)"}
            with retagged(pr, POST):
                _turn(
                    pr,
                    lambda: pr.ops((*issued(step.rescale), step.pv), last),
                    lambda: pr.ops(waits(step.rescale), last),
                )
                pr.ops(step.rest, last)
                w.line("spatialc_wgmma_wait<0>();  // the last block's P·V")
                w.line(f"spatialc_acc_fence({o});  // O is whole: nothing reads it before")
                pin(pr, keys)
                pr.release(step.pop_v, marker(step.pop_v, POST))


def waits(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    """The Waits among `ops` (for K's and V's stages): printed before the turn."""
    return tuple(op for op in ops if isinstance(op, Wait))


def issued(ops: tuple[ChoreoOp, ...]) -> tuple[ChoreoOp, ...]:
    """The rest of `ops`, in their order: printed in the turn."""
    return tuple(op for op in ops if not isinstance(op, Wait))


def _turn(pr: AttentionPrinter, issue: Callable[[], None], wait: Callable[[], None]) -> None:
    """The stages `wait` prints waited for, then the matmuls `issue` prints issued in this warpgroup's turn; then
    the other warpgroup's."""
    me = f"{PINGPONG_BARRIER} + warp / {WARPGROUP}"
    other = f"{PINGPONG_BARRIER + 1} - warp / {WARPGROUP}"
    wait()  # before the turn: a turn never holds the tensor cores while its stages are in flight
    pr.w.line(f"spatialc_engine_sync({me}, {BOTH_THREADS});  // this warpgroup's turn: the other's are issued")
    issue()
    pr.w.line(f"spatialc_engine_arrive({other}, {BOTH_THREADS});  // the other warpgroup's turn")


def _softmax(pr: AttentionPrinter, step: KvStep, env: dict[LoopVar, str], s: str, behind: int) -> None:
    """Once this block's S has retired (`behind`: 1 where the P·V issued after it may run on, 0 for block 0's,
    issued alone): K's stage back, S copied out, and the softmax up to the rescale of O."""
    said = "the P·V issued with it may run on" if behind else "(issued alone)"
    pr.w.line(f"spatialc_wgmma_wait<{behind}>();  // S of this block has retired; {said}")
    pr.w.line(f"spatialc_acc_fence({s});  // nothing reads S before the wait")
    pr.ops((step.pop_k, *step.copy, *step.softmax), env)


def _retired(pr: AttentionPrinter, step: KvStep, o: str, keys: int, block: str, mark: str) -> None:
    """The P·V of `block` retired (after this block's softmax): O may be rescaled, its V goes back."""
    pr.w.line(f"spatialc_wgmma_wait<0>();  // the P·V of block {block} has retired")
    pr.w.line(f"spatialc_acc_fence({o});  // nothing reads O before the wait")
    pin(pr, keys)
    pr.release(step.pop_v, marker(step.pop_v))
