"""The online row pass computed later, every band's page at once (`interp/rowpacks.py`: a pack on the value carried
before it, a rescale, a map of row vectors alone) gives, bit for bit, what computing each where the engine meets it
gives (`support.packed_rows`, `scale_acc`, `elementwise`: the interpreter's definition of each row's value) — the
online softmax, the online log-softmax, the row log-sum-exp, a row mean, LayerNorm's row vectors written, and
attention's running max and sum — on rows that are hard for a running max: NaN, +inf, −inf alone, a row of −inf, rows
whose max grows page by page or falls, ties, subnormals and values near float32's largest; in bf16, fp16 and fp32,
at shapes whose last band and last page are partial, several bands at once."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import spatialc
from spatialc.interp import rowpacks

from .test_lazy_maps import run
from .test_row_packs import eager

PROGRAMS: dict[str, Callable[[], spatialc.SpatialProgram]] = {
    "online softmax bf16": lambda: spatialc.softmax(70, 900, "bf16", online=True),
    "online softmax fp16, fp16 out": lambda: spatialc.softmax(37, 530, "fp16", online=True, out="fp16"),
    "online softmax fp32": lambda: spatialc.softmax(50, 700, "fp32", online=True),
    "online log-softmax bf16": lambda: spatialc.log_softmax(70, 900, "bf16", online=True),
    "online log-softmax fp32, bf16 out": lambda: spatialc.log_softmax(45, 333, "fp32", online=True, out="bf16"),
    "logsumexp bf16": lambda: spatialc.row_reduce(70, 900, "logsumexp", "bf16"),
    "logsumexp fp16": lambda: spatialc.row_reduce(41, 1300, "logsumexp", "fp16"),
    "mean fp32": lambda: spatialc.row_reduce(70, 900, "mean", "fp32"),
    "layernorm bf16": lambda: spatialc.layernorm(70, 900, "bf16"),
}


def hard_rows(m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows a running max and a rescaled sum find hard, one kind a row in turn, the rest normal (× 4)."""
    x = rng.normal(size=(m, n)).astype(np.float32) * 4
    up = np.linspace(-60, 60, n, dtype=np.float32)
    kinds = [
        lambda r: r.__setitem__(slice(None), -np.inf),  # a row of −inf: max −inf, α and P 0 (`passes.rows.floored`)
        lambda r: r.__setitem__(slice(None), up),  # the max grows on every page: every page rescales the sum
        lambda r: r.__setitem__(slice(None), up[::-1]),  # the max is the first page's
        lambda r: r.__setitem__(slice(None), np.float32(2.5)),  # every value tied
        lambda r: r.__setitem__(rng.integers(0, n, 5), r.max()),  # the max tied in five places
        lambda r: r.__setitem__(rng.integers(0, n), np.nan),
        lambda r: r.__setitem__(rng.integers(0, n), np.inf),
        lambda r: r.__setitem__(rng.integers(0, n), -np.inf),
        lambda r: r.__setitem__(slice(None), r * np.float32(1e-39)),  # subnormals
        lambda r: r.__setitem__(rng.integers(0, n, 3), [3e38, -3e38, 3.3e38]),
        lambda r: r.__setitem__(slice(n // 2, None), -np.inf),  # −inf on the later pages: their P 0
        lambda r: r.__setitem__(slice(n - 3, None), 80.0),  # the max on the last (partial) page alone
        lambda r: r.__setitem__(slice(None, 3), np.nan),  # NaN on the first page: NaN carried on
    ]
    for i in range(m):
        if i % 2 == 0:  # (every other row normal: bands mix both)
            kinds[(i // 2) % len(kinds)](x[i])
    return x


def inputs(p: spatialc.SpatialProgram, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {}
    for t in p.tensors:
        if t.role.value == "output":
            continue
        if t.name == "x":
            values[t.name] = hard_rows(*t.elems, rng)
        else:  # (LayerNorm's weight and bias)
            values[t.name] = rng.normal(size=t.elems).astype(np.float32)
    return values


def later_and_eager(p: spatialc.SpatialProgram, values: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch):
    """The outputs computed later (with the sizes of the levels computed, each level's values at once) and eagerly."""
    sizes: list[int] = []
    with monkeypatch.context() as m:
        m.setattr(
            rowpacks,
            "_realise_level",
            lambda lv, ready, f=rowpacks._realise_level: sizes.append(len(lv)) or f(lv, ready),
        )
        later = run(p, values)
    with monkeypatch.context() as m:
        eager(m)
        now = run(p, values)
    return later, now, sizes


def same_bytes(later: dict[str, np.ndarray], now: dict[str, np.ndarray]) -> None:
    assert later.keys() == now.keys()
    for out, got in later.items():
        assert got.dtype == now[out].dtype and got.shape == now[out].shape, out
        assert got.tobytes() == now[out].tobytes(), (
            out,
            np.flatnonzero(got.view(np.uint8) != now[out].view(np.uint8))[:8],
        )


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_online_pass_computed_later_is_the_eager_one_bit_for_bit(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = spatialc.build(PROGRAMS[name](), "sm_90")
    later, now, sizes = later_and_eager(p, inputs(p, len(name)), monkeypatch)
    same_bytes(later, now)
    bands = p.plan.grid[0]
    assert bands > 1 and max(sizes) >= bands, (bands, sizes)  # every band's values of a level computed together


def test_the_hard_rows_are_there() -> None:
    """The inputs hold what the docstring says, in the rows of more than one band and in the last, partial, page: the
    comparison above is on them, not on rows a slip would leave alike."""
    p = spatialc.build(PROGRAMS["online softmax bf16"](), "sm_90")
    x = inputs(p, 1)["x"]
    rows = np.isneginf(x).all(axis=1)
    assert rows.any() and np.isnan(x).any() and np.isposinf(x).any()
    assert (np.abs(x[np.isfinite(x)]) > 1e38).any() and ((x != 0) & (np.abs(x) < 1.2e-38)).any()
    tile = p.tile.cols * p.plan.block.ibw
    assert x.shape[1] % tile and x.shape[0] % p.tile.rows  # a partial last page, a partial last band


def test_one_ulp_apart_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison fails where values move by one ulp: the row vector values that the rescales and the maps of row
    vectors read each nudged to the next float32 after it, as a slip in their order or type would."""
    p = spatialc.build(PROGRAMS["online softmax fp32"](), "sm_90")
    values = inputs(p, 5)
    real = rowpacks._row_columns
    with monkeypatch.context() as m:
        m.setattr(
            rowpacks,
            "_row_columns",
            lambda xs, counts: np.nextafter(np.asarray(real(xs, counts), np.float32), np.float32(2)),
        )
        nudged = run(p, values)
    with monkeypatch.context() as m:
        eager(m)
        now = run(p, values)
    with pytest.raises(AssertionError):
        same_bytes(nudged, now)


def test_attention_s_running_max_and_sum_computed_later_are_the_eager_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention's row max and sum are carried and rescaled as the online softmax's (and its output's rescale reads α
    at once): computed later, the same bytes."""
    p = spatialc.build(spatialc.attention(2, 2, 40, 72, 32, causal=True), "sm_90")
    rng = np.random.default_rng(3)
    values = {
        t.name: rng.normal(size=(t.groups, *t.elems)).astype(np.float32) * 3
        for t in p.tensors
        if t.role.value != "output"
    }
    values["q"][1, 0, :7] = [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-40, 0.0]
    values["k"][0, 5, :3] = [np.inf, -np.inf, 1e-40]
    values["k"][2, 9] = -np.inf  # a key whose scores are −inf (or NaN) in every row
    later, now, sizes = later_and_eager(p, values, monkeypatch)
    same_bytes(later, now)
    assert sizes  # (computed later: the lazy path was taken)
