"""Row accumulators packed later and many bands at once (`interp/rowpacks.py`) give the numbers each pack computed
when it was made gives, bit for bit: the same programs run with every pack computed at its PackAcc (the eager path)
agree exactly — softmax (a max pack read by a map, a sum of computed pages), the online softmax (its maxes carried
from pack to pack, its sum rescaled page by page: `test_online_rows.py` has its hard rows), RMSNorm, LayerNorm (packs
written as outputs) — on inputs with NaN, ±inf, −0, subnormals and values near float32's largest, at shapes of
several bands per chunk and of a ragged last page. And a part of a page's value taken from the pages a pack reduced
(`interp/reuse.py`) is the part computed again."""

from __future__ import annotations

import numpy as np
import pytest

import spatialc
from spatialc.interp import mapped, rowpacks, support

from .test_lazy_maps import run  # every output by name

PROGRAMS = {
    "softmax": lambda: spatialc.softmax(96, 700, "bf16"),
    "softmax, many bands": lambda: spatialc.softmax(512, 1024, "bf16"),
    "softmax fp16 out": lambda: spatialc.softmax(33, 260, "fp16", out="fp16"),
    "online softmax": lambda: spatialc.softmax(64, 1000, "bf16", online=True),
    "rmsnorm": lambda: spatialc.rmsnorm(300, 520, "bf16", eps=1e-5),
    "layernorm": lambda: spatialc.layernorm(200, 300, "bf16"),
}


def inputs_of(p: spatialc.SpatialProgram, rng: np.random.Generator, special: bool) -> dict[str, np.ndarray]:
    values = {}
    for t in p.tensors:
        if t.role.value != "output":
            x = rng.normal(size=t.elems).astype(np.float32) * 4
            if special:
                x.reshape(-1)[rng.integers(0, x.size, size=6)] = [np.nan, np.inf, -np.inf, -0.0, 1e-40, 3e38]
            values[t.name] = x
    return values


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_packs_computed_together_equal_packs_computed_at_once(
    name: str, special: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = spatialc.build(PROGRAMS[name](), "sm_90")
    values = inputs_of(p, np.random.default_rng(len(name)), special)
    chunks: list[int] = []
    with monkeypatch.context() as m:  # (and count the chunks: the later path is taken)
        m.setattr(
            rowpacks,
            "_realise_chunk",
            lambda c, ready=None, f=rowpacks._realise_chunk: chunks.append(len(c)) or f(c, ready),
        )
        later = run(p, values)
    assert chunks  # (the online softmax's too: its carried maxes and rescaled sums are computed later)
    eager(monkeypatch)
    now = run(p, values)
    assert later.keys() == now.keys()
    for out, got in later.items():
        assert got.dtype == now[out].dtype and got.shape == now[out].shape
        assert got.tobytes() == now[out].tobytes(), out


def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row value computed where the engine meets it: each pack at its PackAcc, each rescale at its ScaleAcc,
    each map of row vectors alone at its Compute (`support.packed_rows`, `scale_acc`, `elementwise`)."""
    monkeypatch.setattr(support, "lazy_pack", lambda *args: None)
    monkeypatch.setattr(support, "scaled_later", lambda *args: False)
    monkeypatch.setattr(support, "row_map_later", lambda *args: None)


def test_bands_are_reduced_together() -> None:
    """A chunk's packs of one reduction whose rows lie one after another are one reduce_rows call, not one a band:
    softmax over 64 bands (16 rows of 512 values each) reduces its maxes and its sums in a chunk of 32 bands each."""
    p = spatialc.build(spatialc.softmax(1024, 512, "bf16"), "sm_90")
    values = inputs_of(p, np.random.default_rng(0), False)
    calls: list[int] = []
    real = rowpacks.reduce_rows
    rowpacks.reduce_rows = lambda name, rows, integer: calls.append(rows.shape[0]) or real(name, rows, integer)
    try:
        run(p, values)
    finally:
        rowpacks.reduce_rows = real
    bands = p.plan.grid[0]
    assert bands >= 32 and len(calls) < bands // 4, (bands, calls)
    assert sum(calls) == 2 * 1024  # every row once for its max and once for its sum


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("name", ["softmax", "softmax, many bands", "softmax fp16 out", "layernorm"])
def test_a_part_reused_equals_the_part_computed_again(
    name: str, special: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Softmax's quotient takes exp(x − max) from the pages its sum reduced (`interp/reuse.py`): the same bytes as
    computing it again, and the reuse is taken (LayerNorm's pages hold no part their packs' pages computed: the
    same bytes, nothing reused)."""
    p = spatialc.build(PROGRAMS[name](), "sm_90")
    values = inputs_of(p, np.random.default_rng(7), special)
    hits: list[bool] = []
    with monkeypatch.context() as m:
        m.setattr(mapped, "reused", lambda k, r, f=mapped.reused: hits.append(f(k, r) is not None) or f(k, r))
        reusing = run(p, values)
    assert any(hits) == name.startswith("softmax"), hits
    monkeypatch.setattr(mapped, "reused", lambda kernel, runs: None)
    again = run(p, values)
    for out, got in reusing.items():
        assert got.dtype == again[out].dtype and got.tobytes() == again[out].tobytes(), out


def test_a_part_of_other_tiles_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The part is matched page by page: where one page's x tiles are not its counterpart's (planted: one comparison
    answered as if the page read the next tile), that batch computes the part again — one reuse fewer, and the output
    still the bytes of no reuse at all."""
    from spatialc.interp import reuse
    from spatialc.interp.pages import TileRefs

    p = spatialc.build(PROGRAMS["softmax, many bands"](), "sm_90")
    values = inputs_of(p, np.random.default_rng(3), False)

    def hits_of(same_page: object) -> tuple[int, dict[str, np.ndarray]]:
        hits: list[bool] = []
        with monkeypatch.context() as m:
            m.setattr(reuse, "_same_page", same_page)
            m.setattr(mapped, "reused", lambda k, r, f=mapped.reused: hits.append(f(k, r) is not None) or f(k, r))
            out = run(p, values)
        return hits.count(True), out

    planted: list[object] = []

    def one_off(a: object, b: object, real: object = reuse._same_page) -> bool:
        if not planted and a.__class__ is TileRefs:
            planted.append(a)
            return real(a, TileRefs(b.store, b.at + 1, b.off))  # type: ignore[attr-defined,operator]
        return real(a, b)  # type: ignore[operator]

    n, _ = hits_of(reuse._same_page)
    fewer, out = hits_of(one_off)
    assert planted and n > 1 and fewer == n - 1
    monkeypatch.setattr(mapped, "reused", lambda kernel, runs: None)
    assert out["out"].tobytes() == run(p, values)["out"].tobytes()
