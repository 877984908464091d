"""The named barriers a kernel prints are checked before it is printed (lower/cuda/common/barrier_ids.py): each
user's ids disjoint from every other's and within 1 to 15 (0 is __syncthreads'). A collision planted in the sm_90a
ping-pong (its turns moved onto the staging boxes' barriers, or past 15) is refused with a typed error naming both
users; the kernels spatialc prints pass, and what each uses is the printed text's."""

from __future__ import annotations

import pytest

import spatialc
from spatialc.lower.cuda.common.barrier_ids import check_barrier_ids, engine_barriers
from spatialc.lower.cuda.sm90a import pingpong, staging
from spatialc.lower.cuda.sm90a.attention import make_attention_kernel
from spatialc.lower.cuda.sm90a.barriers import barrier_uses
from spatialc.lower.errors import BarrierClash
from spatialc.target import target


@pytest.fixture(scope="module")
def two_warpgroups():
    """Attention on two consumer warpgroups (bands of 128 rows): the ping-pong by default."""
    return spatialc.build(spatialc.attention(1, 2, 128, 96, 64, kv_heads=1), "sm_90a", form="sm90a", block=(8, 4, 1))


def test_the_ping_pong_kernel_uses_disjoint_barriers_and_prints_them(two_warpgroups):
    hk = make_attention_kernel(two_warpgroups, target("sm_90a"))
    uses = barrier_uses(hk)
    assert uses["the staging boxes (OUT_BAR)"] == (8, 9) and uses["the ping-pong's turns"] == (10, 11)
    assert [ids for who, ids in uses.items() if who.startswith("engine ")] == [(1,), (2,), (3,)]
    text = spatialc.lower(two_warpgroups).kernel_cu
    assert "#define OUT_BAR 8" in text and "spatialc_engine_sync(10 + warp / 4, 256);" in text


@pytest.mark.parametrize(
    ("first", "says"),
    [
        # warpgroup 0's turn on warpgroup 1's staging barrier: their arrivals would count in each other's phases
        (staging.OUT_BARRIER + 1, r"named barrier 9 is used by the staging boxes \(OUT_BAR\) and by the ping-pong"),
        (15, r"the ping-pong's turns uses barrier 16, and a CTA's named barriers are 1 to 15"),  # warpgroup 1's: 16
    ],
)
def test_a_planted_collision_is_refused_before_printing(two_warpgroups, monkeypatch, first, says):
    monkeypatch.setattr(pingpong, "PINGPONG_BARRIER", first)
    with pytest.raises(BarrierClash, match=says):  # (the kernel built anew: `lower` memoises the one above)
        make_attention_kernel(two_warpgroups, target("sm_90a"))


def test_the_general_forms_engines_take_one_barrier_each_and_at_most_fifteen():
    check_barrier_ids(engine_barriers(f"e{i}" for i in range(15)))  # barriers 1 … 15
    with pytest.raises(BarrierClash, match=r"engine 15 \(e15\) uses barrier 16"):
        check_barrier_ids(engine_barriers(f"e{i}" for i in range(16)))
    with pytest.raises(BarrierClash, match=r"engine 0 \(reader\) uses barrier 0.*0 is __syncthreads'"):
        check_barrier_ids({"engine 0 (reader)": (0,)})
