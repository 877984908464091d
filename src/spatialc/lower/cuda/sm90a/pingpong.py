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

    wait for this warpgroup's turn
    rescale O, wait for V_{j−1}; wait for K_j, zero S, issue S_j; issue P_{j−1}·V_{j−1} (A: P's fragments)
    arrive on the other warpgroup's barrier: its turn
    wait until S_j has retired (wait_group 1: P·V runs on), release K_j, copy S_j to registers
    the softmax of block j, up to the rescale of O                               (… during P·V and the other's turn)
    wait until P_{j−1}·V_{j−1} has retired (wait_group 0), release V_{j−1}

before the loop block 0's S in a turn of its own and its softmax, after it block (trip − 1)'s P·V in a turn of its
own. Every ring is waited, reserved and released in its program order, as in the overlapped schedule (`overlap.py`).
Unlike that schedule it takes K and V one stage deep: a turn waits for V_{j−1} before K_j, the producer's order, and
a warpgroup has released K_{j−1} and V_{j−2} by the end of its step j − 1, which the producer needs to land V_{j−1} and
K_j (emulated so; the default still asks for two stages). Every item must run a KV step (block 0's S is issued before
the loop). No second set of S registers is live during a softmax: S is copied out before the softmax, and the next S
is issued only after it; ptxas still spills above head_dim 128 (`attention.py` refuses it there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ....ir.ids import LoopVar, loop_var_name
from ....ir.ops import Loop, Span
from ...census import POST, PRE, marker
from ...errors import Unsupported
from ..common.cwriter import span_count
from .overlap import KvStep, least_trip, pin, retagged
from .plan import WARPGROUP

if TYPE_CHECKING:
    from .attention import AttentionPrinter

# The two warpgroups' named barriers: PINGPONG_BARRIER + the warpgroup (after the engines' 1 + their index and the
# staging boxes' 8 and 9, `staging.OUT_BARRIER`; a CTA has 16), each counting both warpgroups' threads. `barriers.py`
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
    v = loop_var_name(loop.var)
    s = pr.k.layers[pr.k.rings.template[step.s_acc]].name
    o = pr.k.layers[pr.k.rings.template[step.o_acc]].name
    keys = step.pv.op.block.ibw  # type: ignore[union-attr]
    with w.block():
        if isinstance(loop.count, Span):
            for line in span_count(loop.count, env, f"trip_{v}"):
                w.line(line)
            trip = f"trip_{v}"
        else:
            trip = str(loop.count.n)  # type: ignore[union-attr]
        w.line(f"spatialc_frag<OPT> af[{keys}];  // P of each 16 keys, P·V's A: held until its group retires")
        first = "// block 0's S in a turn of its own, and its softmax: each step issues the next S"
        with w.block("", first), retagged(pr, PRE):
            _turn(pr, lambda: pr.ops(step.issue_s, env | {loop.var: "0"}))
            _softmax(pr, step, env | {loop.var: "0"}, s, 0)
        with w.block(f"for (int {v} = 1; {v} < {trip}; ++{v})", mark):
            before = env | {loop.var: f"({v} - 1)"}  # (the rescale and P·V are the block before's)
            here = env | {loop.var: v}

            def issue() -> None:
                pr.ops(step.rescale, before)
                pr.ops(step.issue_s, here)
                pr.ops((step.pv,), before)

            _turn(pr, issue)
            pr.ops(step.rest, before)
            _softmax(pr, step, here, s, 1)
            _retired(pr, step, o, keys, f"{v} - 1", mark)
        with w.block("", "// the last block's P·V in a turn of its own"):
            last = env | {loop.var: f"({trip} - 1)"}
            with retagged(pr, POST):
                _turn(pr, lambda: pr.ops((*step.rescale, step.pv), last))
                pr.ops(step.rest, last)
                w.line("spatialc_wgmma_wait<0>();  // the last block's P·V")
                w.line(f"spatialc_acc_fence({o});  // O is whole: nothing reads it before")
                pin(pr, keys)
                pr.release(step.pop_v, marker(step.pop_v, POST))


def _turn(pr: AttentionPrinter, issue) -> None:
    """The matmuls `issue` prints, issued in this warpgroup's turn; then the other warpgroup's."""
    me = f"{PINGPONG_BARRIER} + warp / {WARPGROUP}"
    other = f"{PINGPONG_BARRIER + 1} - warp / {WARPGROUP}"
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
