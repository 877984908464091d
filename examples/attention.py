"""Attention written by hand: O = softmax(scale · Q·Kᵀ + mask) · V and each query row's log-sum-exp, by
FlashAttention's online recurrence over blocks of keys.

It declares what `spatialc.attention(1, 4, 128, 200, 32, kv_heads=2, causal=True)` declares — reads of Q, K and V,
one `attention` stage, writes of O and LSE — and runs the schedule the attention planner makes for it on 2 sites
(`passes/attention.py`), op for op (tests/lang/test_attention_lang.py checks they are equal). An item is a band of
4 tile rows of queries of one KV head; its query heads (grouped-query attention: 2 a KV head) run one after another,
each walking the head's keys 4 tile rows a step, up to the band's diagonal (causal: the blocks past it are all
masked, so an item runs min(all, ceil(keys its last row sees / 64)) of them — a count each item knows, `range_span`):

    S  = Q · Kᵀ                      s_acc.product(q, k, transpose_b=True): K's rows as they are stored
    X  = mask(keep, scale · S)        a map: a key past the row's diagonal (causal) or past seq_kv is −∞
    m_old = m;  m ⊕= rowmax(X);  m_new = m
    α  = exp(m_old − m_new)           P = exp(X − m_new)
    l ·= α;  l ⊕= rowsum(P);  O ·= α;  O += P · V

then O / l and LSE = m + log l. The maps and reductions no stage declares are steps of the declared `attention`
stage: verify's rule 8 proves they run exactly this recurrence, and that it equals the softmax (docs/verification.md).

    python examples/attention.py      # traces it and checks it against the planner's schedule
"""

from __future__ import annotations

import math

from spatialc import ew, lang

BATCH, HEADS, KV_HEADS, SEQ_Q, SEQ_KV, HEAD_DIM = 1, 4, 2, 128, 200, 32
BH, BW, DEPTH, SITES = 4, 4, 2, 2  # a band of 4 query tile rows, a block of 4 key tile rows, K and V 2 pages deep


@lang.program(target="sm_90", precision="bf16", name="attention_1x4x128x200x32_bf16_causal_kv2")
def attention(p: lang.Builder):
    tile = 16
    dt = -(-HEAD_DIM // tile)  # tiles a row of Q, K, V, O
    group = HEADS // KV_HEADS  # query heads a KV head serves
    bands, blocks = -(-SEQ_Q // (tile * BH)), -(-SEQ_KV // (tile * BW))
    rows_q, rows_kv = bands * BH, blocks * BW  # a head's tile rows, padded to whole bands and blocks
    scale = 1 / math.sqrt(HEAD_DIM)

    # Each head's rows stacked one head after another (a group each), padded to whole bands (Q, O, LSE) or blocks.
    q = p.input("q", SEQ_Q, HEAD_DIM, groups=BATCH * HEADS, tiles=(BATCH * HEADS * rows_q, dt))
    k = p.input("k", SEQ_KV, HEAD_DIM, groups=BATCH * KV_HEADS, tiles=(BATCH * KV_HEADS * rows_kv, dt))
    v = p.input("v", SEQ_KV, HEAD_DIM, groups=BATCH * KV_HEADS, tiles=(BATCH * KV_HEADS * rows_kv, dt))
    o = p.output("o", SEQ_Q, HEAD_DIM, groups=BATCH * HEADS, tiles=(BATCH * HEADS * rows_q, dt))
    lse = p.output("lse", SEQ_Q, 1, groups=BATCH * HEADS, tiles=(BATCH * HEADS * rows_q, 1))

    # The declared rings (Q's, K's and V's pages swizzled for the tensor cores' loads, as the planner lays them out),
    # then the recurrence's: a band of scores (BH x BW tiles), a row vector (one tile a band row), a band of O (BH x
    # dt); and its accumulators.
    q_ring = p.ring("q_ring", depth=1, tiles=BH * dt, layout="swizzled")
    k_ring = p.ring("k_ring", depth=DEPTH, tiles=BW * dt, layout="swizzled")
    v_ring = p.ring("v_ring", depth=DEPTH, tiles=BW * dt, layout="swizzled")
    o_ring = p.ring("o_ring", depth=1, tiles=BH * dt)
    lse_ring = p.ring("lse_ring", depth=1, tiles=BH)

    def step(name: str, tiles: int) -> lang.RingRef:  # a ring between two steps of the compute engine, one page
        return p.ring(name, depth=1, tiles=tiles, kind="interm")

    s_ring, x_ring, p_ring = (step(n, BH * BW) for n in ("s_ring", "x_ring", "p_ring"))
    m_old, m_new, alpha = (step(n, BH) for n in ("m_old_ring", "m_new_ring", "alpha_ring"))
    o_packed = step("o_acc_ring", BH * dt)
    l_packed, m_packed = (step(n, BH) for n in ("l_ring", "m_ring"))
    s_acc = p.accumulator("s_acc", tiles=BH * BW)
    m_acc, l_acc = p.accumulator("m_acc", tiles=BH), p.accumulator("l_acc", tiles=BH)
    o_acc = p.accumulator("o_acc", tiles=BH * dt)

    # What the program computes: attention of what is read into q_ring, k_ring and v_ring.
    p.read("read_q", q, q_ring)
    p.read("read_k", k, k_ring)
    p.read("read_v", v, v_ring)
    p.attention("attention", q_ring, k_ring, v_ring, o_ring, lse_ring, causal=True, scale=scale)
    p.write("write_o", o_ring, o)
    p.write("write_lse", lse_ring, lse)

    # A GEMM plan read for attention: a block of BH query tile rows by head_dim, BW key tiles a step; the grid is
    # (bands, KV heads); the items go to the sites in contiguous runs.
    p.plan(block=(BH, dt, BW), grid=(bands, BATCH * KV_HEADS), k_tiles=rows_kv, depth=DEPTH)
    items = bands * BATCH * KV_HEADS
    p.place([list(range(s * items // SITES, (s + 1) * items // SITES)) for s in range(SITES)], kind="contiguous")

    def band(item: lang.Item, h) -> lang.Affine:  # the tile row of the band of query head h of the item's KV head
        return group * rows_q * item.x + rows_q * h + BH * item.y

    def keys(e: lang.Engine, item: lang.Item):  # the KV blocks at or left of the band's diagonal, at most all
        last = tile * BH * item.y + tile * BH + (SEQ_KV - SEQ_Q)  # the band's last visible key + 1
        return e.range_span(last, per=tile * BW, bound=blocks, name="k")

    def keep():  # 1 where the mask keeps a score: a key inside seq_kv, at or left of the row's diagonal
        row, col = ew.row_index(), ew.col_index()
        return (col < SEQ_KV) * (col <= row + (SEQ_KV - SEQ_Q))

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for h in e.range(group, "head"):
                with q_ring.reserve() as page:
                    page.read(q, dt * band(item, h), BH, dt)
                for kk in keys(e, item):
                    for ring, tensor in ((k_ring, k), (v_ring, v)):
                        with ring.reserve() as page:
                            page.read(tensor, rows_kv * dt * item.x + BW * dt * kk, BW, dt)

    @p.compute
    def compute(e: lang.Engine):
        for item in e.items():
            for _ in e.range(group, "head"):
                qp = q_ring.wait()
                for acc in (m_acc, l_acc, o_acc):
                    acc.acquire()
                for kk in keys(e, item):
                    kp = k_ring.wait()  # S = Q · Kᵀ
                    s_acc.acquire()
                    s_acc.product(qp, kp, block=(BH, BW, dt), transpose_b=True)
                    kp.pop()
                    with s_ring.reserve() as page:
                        s_acc.pack(page)
                    s_acc.release()
                    with s_ring.wait() as s, x_ring.reserve() as x:  # X = mask(keep, scale · S)
                        e.map(lambda s: ew.mask(keep(), s * scale), s, x, at=BW * kk, width=BW, row=BH * item.y)
                    with m_old.reserve() as page:  # m_old = m; m ⊕= rowmax(X); m_new = m
                        m_acc.pack(page)
                    xp = x_ring.wait()
                    m_acc.reduce("max", xp, at=BW * kk, width=BW, cols=SEQ_KV)
                    with m_new.reserve() as page:
                        m_acc.pack(page)
                    old, new = m_old.wait(), m_new.wait()  # α = exp(m_old − m_new)
                    with alpha.reserve() as page:
                        e.map(lambda old, new: ew.exp(old - new), [old, new], page, width=1)
                    old.pop()
                    with p_ring.reserve() as page:  # P = exp(X − m_new)
                        e.map(lambda x, m: ew.exp(x - m), [xp, new], page, width=BW)
                    xp.pop()
                    new.pop()
                    a, pp = alpha.wait(), p_ring.wait()  # l ·= α; l ⊕= rowsum(P); O ·= α; O += P · V
                    l_acc.scale(a)
                    l_acc.reduce("sum", pp, at=BW * kk, width=BW, cols=SEQ_KV)
                    o_acc.scale(a)
                    a.pop()
                    with v_ring.wait() as vp:
                        o_acc.product(pp, vp, block=(BH, dt, BW))
                    pp.pop()
                qp.pop()
                for acc, ring in ((o_acc, o_packed), (l_acc, l_packed), (m_acc, m_packed)):
                    with ring.reserve() as page:
                        acc.pack(page)
                    acc.release()
                op, lp, mp = o_packed.wait(), l_packed.wait(), m_packed.wait()  # O = O / l; LSE = m + log l
                with o_ring.reserve() as page:
                    e.map(lambda acc, total: acc / total, [op, lp], page, width=dt)
                with lse_ring.reserve() as page:
                    e.map(lambda m, total: m + ew.log(total), [mp, lp], page, width=1)
                for page in (op, lp, mp):
                    page.pop()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            for h in e.range(group, "head"):
                with o_ring.wait() as page:
                    page.write(o, dt * band(item, h), BH, dt)
                with lse_ring.wait() as page:
                    page.write(lse, band(item, h), BH, 1)


if __name__ == "__main__":
    import spatialc
    from spatialc.passes.attention import apply_attention_plan, place_attention, plan_attention, schedule_attention
    from spatialc.target import target

    traced = attention.trace().program  # type: ignore[attr-defined]
    t = target("sm_90")
    declared = spatialc.attention(BATCH, HEADS, SEQ_Q, SEQ_KV, HEAD_DIM, kv_heads=KV_HEADS, causal=True)
    planned = apply_attention_plan(declared, plan_attention(declared, t, (BH, BW), DEPTH))
    built = schedule_attention(place_attention(planned, t, SITES))
    same = traced == built
    print(f"{traced.name}: {'the planner schedule, op for op' if same else 'NOT the planner schedule'}")
