"""Attention's numerics: the declared function computed directly, the online recurrence run block by block, and the
bound a result of an attention program meets.

- `softmax_attention` is the declaration (`ir.ops.Attention`) itself, in float64: S = scale · Q·Kᵀ, −∞ where the
  mask leaves a key out, O = softmax(S) · V and LSE = log Σ exp(S) along each row — the reference.
- `online_attention` is the canonical recurrence the schedule runs (passes/attention.py), in float64, block by block:
  m′ = max(m, rowmax(S)), P = exp(S − m′), α = exp(m − m′), l′ = α·l + rowsum(P), acc′ = α·acc + P·V, and at the
  end O = acc / l, LSE = m + log l. docs/verification.md argues once that it equals `softmax_attention`; the tests
  check it on random shapes, blocks and masks.
- `attention_bound` states how far an interpreted (or a kernel's) O and LSE may lie from the reference
  (docs/numerics.md, "Attention").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..ir.nodes import DType, SpatialProgram
from ..ir.ops import Attention, Precision
from .narrow import FLOAT32_MAX

EPS32 = 2.0**-23  # one float32 ulp at 1.0
U32 = 2.0**-24  # float32's unit roundoff
# An operand type's unit roundoff (P is rounded to it before P·V), and the absolute error its rounding may add below
# its normal range (fp16's subnormals are 2^-24 apart; bf16's reach 2^-133): with float32's own underflow, 2^-126.
OPERAND_U = {Precision.BF16: 2.0**-8, Precision.FP16: 2.0**-11}
OPERAND_FLOOR = {Precision.BF16: 2.0**-133 + 2.0**-126, Precision.FP16: 2.0**-25 + 2.0**-126}


FLOAT32_HOLDS = "the kernel holds it in float32: at most 3.4e38, and not so small it rounds to 0"


def valid_scale(scale: object) -> bool:
    """Whether `scale` is a scale attention takes: a real number > 0 (not a bool) whose float32 value — what the
    kernel and a Map's constants hold — is finite and > 0; what `spatialc.attention` accepts and verify holds a saved
    declaration to. 1e308 (float32 inf) and 1e-50 (float32 0) are refused like NaN and inf, before any cast."""
    import numbers

    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        return False
    try:
        value = float(scale)
    except OverflowError:  # an int past float's range (10**400) is no scale a kernel can hold
        return False
    if not (math.isfinite(value) and 0 < value <= FLOAT32_MAX):  # verify's bound on a float32 constant, exactly
        return False
    with np.errstate(under="ignore"):  # the cast's own underflow is the answer, not a warning
        single = np.float32(value)
    return bool(single > 0)


def keyless(seq_q: int, seq_kv: int, causal: bool) -> str | None:
    """Why the mask leaves a query row no key, or None. A causal mask aligned bottom right hides every key from the
    first seq_q − seq_kv rows where seq_q > seq_kv: their softmax is 0 / 0 (NaN in the reference), and rule 8's
    argument starts from a first block that leaves each row a key (docs/verification.md). What `spatialc.attention`,
    lang's `p.attention` and `spatialc.torch.attention` refuse, and verify holds a saved declaration to."""
    if not causal or seq_q <= seq_kv:
        return None
    return (
        f"a causal attention with seq_q ({seq_q}) > seq_kv ({seq_kv}) leaves its first {seq_q - seq_kv} query rows no"
        " key (the mask is aligned bottom right); use seq_q ≤ seq_kv"
    )


def keep(seq_q: int, seq_kv: int, causal: bool, first: int = 0, rows: int | None = None) -> np.ndarray:
    """Which scores the mask keeps, (rows, seq_kv) for the query rows first … first + rows − 1 (all seq_q unless
    told): every key, or for a causal attention the keys c ≤ r + seq_kv − seq_q (aligned bottom right)."""
    n = seq_q - first if rows is None else rows
    r = first + np.arange(n)[:, None]
    c = np.arange(seq_kv)[None, :]
    return np.ones((n, seq_kv), bool) if not causal else c <= r + (seq_kv - seq_q)


def kv_of(q: np.ndarray, kv: np.ndarray, group: int) -> np.ndarray:
    """K or V as the query heads read it: query head g (of batch · heads, one after another) reads KV head
    g // group."""
    _reads(q, kv, group)
    return np.repeat(kv, group, axis=0) if group > 1 else kv


def _reads(q: np.ndarray, kv: np.ndarray, group: int) -> None:
    """ValueError unless Q's heads read K's (or V's) `group` to one."""
    if kv.shape[0] * group != q.shape[0]:
        raise ValueError(f"{q.shape[0]} query heads do not read {kv.shape[0]} KV heads {group} to one")


def scores(
    q: np.ndarray, k: np.ndarray, scale: float, causal: bool, group: int = 1, first: int = 0, seq_q: int | None = None
) -> np.ndarray:
    """scale · Q·Kᵀ of each head in float64 (products of fp16 / bf16 values are exact, the sums float64's), −∞ where
    the mask leaves a key out: (heads, rows, seq_kv). q holds the query rows first, first + 1, … of seq_q (all of
    them unless told)."""
    q64, k64 = np.asarray(q, np.float64), np.asarray(kv_of(q, k, group), np.float64)
    s = scale * (q64 @ k64.transpose(0, 2, 1))
    n = q.shape[1] if seq_q is None else seq_q
    return np.where(keep(n, k.shape[1], causal, first, q.shape[1]), s, -np.inf)


SCORES_AT_ONCE = 1 << 22  # scores the reference and the bound hold at once: each float64 temporary 32 MiB


def pieces(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, group: int
) -> Iterator[tuple[tuple[slice, slice], np.ndarray, np.ndarray, np.ndarray]]:
    """(heads, rows), Q's block of them and K and V of those heads, in pieces of about SCORES_AT_ONCE scores and K's
    and V's values (whole heads, or a block of one head's rows): each query row's softmax is its own, so the
    reference and the bound are computed a piece at a time, their memory a few pieces' whatever seq_q · seq_kv."""
    _reads(q, k, group)
    _reads(q, v, group)
    heads, seq_q, seq_kv, dim = q.shape[0], q.shape[1], k.shape[1], q.shape[2]
    per = max(1, SCORES_AT_ONCE // (seq_kv * (seq_q + 2 * dim)))  # whole heads a piece: scores, K and V
    rows = max(1, SCORES_AT_ONCE // seq_kv)  # (at least seq_q where a head fits)
    for h in range(0, heads, per):
        kv = np.arange(h, min(h + per, heads)) // group  # the KV head each query head reads
        for r in range(0, seq_q, rows):
            at = (slice(h, h + per), slice(r, r + rows))
            yield at, q[at], k[kv], v[kv]


def softmax_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool = False, group: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(O, LSE) of the declared function in float64: O = softmax(S) · V, LSE = log Σ exp(S) along each row, S the
    masked scores (`scores`). q is (heads, seq_q, dim), k and v (kv heads, seq_kv, dim); LSE is (heads, seq_q, 1).
    Computed a piece of rows at a time (`pieces`)."""
    o, lse = np.empty((*q.shape[:2], v.shape[2])), np.empty((*q.shape[:2], 1))
    for at, qq, kk, vv in pieces(q, k, v, group):
        s = scores(qq, kk, scale, causal, 1, at[1].start, q.shape[1])
        m = np.max(s, axis=2, keepdims=True)
        p = np.exp(s - m)
        l = np.sum(p, axis=2, keepdims=True)  # noqa: E741 — the recurrence's name
        o[at] = (p @ np.asarray(vv, np.float64)) / l
        lse[at] = m + np.log(l)
    return o, lse


def online_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    causal: bool = False,
    group: int = 1,
    block: int = 64,
    bounds: tuple[int, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(O, LSE) by the canonical recurrence, in float64: the keys in blocks of `block` (or between the given
    `bounds`, 0 … seq_kv), in order, each once; m and l start at −∞ and 0. The first block must leave every row a
    key (column 0 always is one), else exp(−∞ − (−∞)) would be NaN, as in every kernel."""
    s = scores(q, k, scale, causal, group)
    vv = np.asarray(kv_of(q, v, group), np.float64)
    n = s.shape[2]
    edges = tuple(bounds) if bounds is not None else (*range(0, n, block), n)
    m = np.full((*s.shape[:2], 1), -np.inf)
    l = np.zeros_like(m)  # noqa: E741 — the recurrence's name
    acc = np.zeros((*s.shape[:2], vv.shape[2]))
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sj = s[:, :, lo:hi]
        m_new = np.maximum(m, np.max(sj, axis=2, keepdims=True, initial=-np.inf))
        p = np.exp(sj - m_new)
        alpha = np.exp(m - m_new)
        l = alpha * l + np.sum(p, axis=2, keepdims=True)  # noqa: E741
        acc = alpha * acc + p @ vv[:, lo:hi]
        m = m_new
    return acc / l, m + np.log(l)


def attention_op(p: SpatialProgram) -> Attention:
    """The program's declaration (`spatialc.attention`'s stage)."""
    from ..passes.attention import attention_shape

    return attention_shape(p).op


def attention_inputs(p: SpatialProgram, inputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K and V as (heads, seq, dim) arrays of the operand type's values (checked and rounded as the interpreter
    takes them: (batch, heads, seq, dim) arrays too)."""
    from ..inputs import check_inputs, specs_of
    from ..passes.attention import attention_shape

    values = check_inputs(p.name, specs_of(p), inputs)
    out = []
    for tid, _ in attention_shape(p).reads:
        t = p.tensor(tid)  # type: ignore[arg-type]
        out.append(np.asarray(values[t.name], np.float64).reshape(t.groups, *t.elems))
    q, k, v = out
    return q, k, v


def outputs(p: SpatialProgram) -> tuple[Any, Any]:
    """The O and LSE tensors."""
    from ..passes.attention import attention_shape

    o, lse = (p.tensor(tid) for tid, _ in attention_shape(p).writes)  # type: ignore[arg-type]
    return o, lse


def grouped(x: np.ndarray, groups: int) -> np.ndarray:
    """An output as `spatialc.evaluate` gives a tensor of `groups` groups: (groups, rows, cols), or (rows, cols)."""
    return x if groups > 1 else x[0]


def attention_reference(p: SpatialProgram, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """{O's name: O, LSE's name: LSE} of the declared function, each in its tensor's element type and shape."""
    from .rounding import output_values

    op = attention_op(p)
    q, k, v = attention_inputs(p, inputs)
    with np.errstate(over="ignore", invalid="ignore"):  # NaN / ±inf inputs: said once, by check_inputs
        o, lse = softmax_attention(q, k, v, op.scale, op.causal, op.group)
    to, tl = outputs(p)
    return {
        to.name: output_values(to.name, grouped(o, to.groups), to.dtype),
        tl.name: output_values(tl.name, grouped(lse, tl.groups), tl.dtype),
    }


def attention_bound(p: SpatialProgram, inputs: Mapping[str, Any], kernel: bool = False) -> dict[str, np.ndarray]:
    """How far each element of O and LSE may lie from `attention_reference` (docs/numerics.md, "Attention").

    With w_c the weight a key's value gets in the result (P's float32 value times the α of every later block),
    O = Σ w_c(1 + η_c)·v_c / Σ w_c: η_c is P's rounding to the operand type before P·V (|η| ≤ u, 2^-8 bf16, 2^-11
    fp16, plus a floor below its normal range), and w_c = exp(s_c − M)(1 + ρ_c) up to a factor all keys share. ρ
    gathers the float32 roundings of scale·S, of each x − m and of each exp and α: at most 2^-24·(blocks + 2)·(5R + 3)
    for R the row's largest |score|. A shared factor cancels in O; what differs moves a weighted mean by at most 2ρ of
    the weighted |V|. So |O − ref| ≤ (u + 2ρ + 8·2^-24)·(softmax(S)·|V|) + floor·Σ|v| + 2 ulps of O's type, and
    |LSE − ref| ≤ ρ + 3·2^-24·R + 2^-22·(|log l| + |LSE| + 1) + 2 float32 ulps. A kernel (`kernel`) sums S over
    head_dim and P·V and l over the keys in float32: (dim + 4) ulps of |scale|·|Q|·|K|ᵀ more in each score, 2·(seq_kv +
    4) ulps of softmax(S)·|V| more in O."""
    op = attention_op(p)
    q, k, v = attention_inputs(p, inputs)
    to, tl = outputs(p)
    e_o, e_l = np.empty((*q.shape[:2], v.shape[2])), np.empty((*q.shape[:2], 1))
    for at, qq, kk, vv in pieces(q, k, v, op.group):  # (a piece of rows at a time: each row's bound is its own)
        e_o[at], e_l[at] = _bound_of(p, op, to.dtype, (qq, kk, vv), at[1].start, kernel)
    e_o = np.where(np.isnan(e_o), np.inf, e_o)  # a NaN input's row: any value (the reference is NaN there too)
    e_l = np.where(np.isnan(e_l), np.inf, e_l)
    return {to.name: grouped(e_o, to.groups), tl.name: grouped(e_l, tl.groups)}


def _bound_of(
    p: SpatialProgram, op: Attention, out: DType, qkv: tuple[np.ndarray, ...], first: int, kernel: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`attention_bound` of the query rows first, first + 1, … that q holds (k and v: the KV heads its heads read),
    O of type `out`."""
    from .tolerance import OUT_EPS, out_rounding

    q, k, v = qkv
    blocks = math.ceil(op.seq_kv / p.tile.rows)  # at most: a block is one tile row of keys or more
    vv = np.abs(np.asarray(v, np.float64))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        s = scores(q, k, op.scale, op.causal, 1, first, op.seq_q)
        kept = np.isfinite(s) | np.isnan(s)
        big = np.max(np.where(kept, np.abs(s), 0.0), axis=2, keepdims=True)  # R, each row's
        shift = 3 * U32 * big
        if kernel:
            qk = np.abs(q) @ np.abs(k).transpose(0, 2, 1)
            shift = shift + abs(op.scale) * (q.shape[2] + 4) * EPS32 * np.max(qk, axis=2, keepdims=True)
        rho = 1.01 * (U32 * (blocks + 2) * (5 * big + 3) + shift)
        m = np.max(s, axis=2, keepdims=True)
        w = np.exp(s - m)
        l = np.sum(w, axis=2, keepdims=True)  # noqa: E741
        weighted = (w / l) @ vv  # softmax(S) · |V|
        o = (w @ np.asarray(v, np.float64)) / l
        lse = m + np.log(l)
        u = OPERAND_U[p.precision] + 2 * rho + 8 * U32 + (2 * (op.seq_kv + 4) * EPS32 if kernel else 0.0)
        e_o = 1.01 * u * weighted + OPERAND_FLOOR[p.precision] * (kept @ vv)
        e_o = e_o + out_rounding(OUT_EPS.get(out, EPS32), _rounded(o, out))
        e_l = rho + shift + 2.0**-22 * (np.abs(np.log(l)) + np.abs(lse) + 1) + out_rounding(EPS32, lse)
    return e_o, e_l


def past_range(p: SpatialProgram, inputs: Mapping[str, Any], kernel: bool = False) -> np.ndarray:
    """Each query row (in LSE's shape) whose scores may leave float32's range: |Q|·|K|ᵀ over a key the mask keeps —
    S as its float32 holds it (a kernel's sum, with its head_dim + 4 ulps) — or |scale| times it at float32's largest
    value or past it. The interpreter and a kernel hold S and scale · S in float32 (docs/numerics.md, "Attention"),
    so such a row's O and LSE may be ±inf or NaN where the float64 reference is finite. (A row an infinite input
    makes infinite is said already, by check_inputs.)"""
    from .tolerance import F32_MAX

    op = attention_op(p)
    q, k, v = attention_inputs(p, inputs)
    grow = max(1.0, op.scale) * (1 + ((q.shape[2] + 4) * EPS32 if kernel else 0.0))
    past = np.zeros((*q.shape[:2], 1), bool)
    with np.errstate(over="ignore", invalid="ignore"):
        # Σ_d |q_d| · max_c |k_cd| is at least each row's largest |Q|·|K|ᵀ: where it stays within range, so do they
        # all (nearly every input, without the scores' matmul).
        loose = np.abs(q) @ kv_of(q, np.max(np.abs(k), axis=1, keepdims=True), op.group).transpose(0, 2, 1)
        if not np.any(np.isfinite(loose) & (loose * grow >= F32_MAX)):
            return grouped(past, outputs(p)[1].groups)
        for at, qq, kk, _ in pieces(q, k, v, op.group):
            qk = np.abs(qq) @ np.abs(kk).transpose(0, 2, 1)
            qk = np.where(keep(op.seq_q, op.seq_kv, op.causal, at[1].start, qq.shape[1]), qk, 0.0)
            big = np.max(qk, axis=2, keepdims=True) * grow
            past[at] = np.isfinite(big) & (big >= F32_MAX)
    return grouped(past, outputs(p)[1].groups)


def _rounded(x: np.ndarray, dtype: DType) -> np.ndarray:
    """|O| as its output type holds it (the reference's, whose ulps the output rounding spends)."""
    from .rounding import output_values

    return np.asarray(output_values("o", x, dtype), np.float64)
