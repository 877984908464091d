"""Elementwise pages computed later and many at once (`interp/mapped.py`) give the numbers each page computed alone
gives, bit for bit: the same programs run with every map made page by page (the eager path) agree exactly — softmax
and RMSNorm (row vectors, column vectors, row reductions of computed pages), LayerNorm (several outputs), maps of
free layout, broadcast vectors along rows and columns, GEMM epilogues with a residual page, and every output type."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import spatialc
from spatialc import ew
from spatialc.interp import mapped

X, G = ew.inputs(2)
PROGRAMS = {
    "softmax": lambda: spatialc.softmax(40, 300, "bf16"),
    "softmax fp16 out": lambda: spatialc.softmax(33, 260, "fp16", out="fp16"),
    "rmsnorm": lambda: spatialc.rmsnorm(48, 520, "bf16", eps=1e-5),
    "rmsnorm bf16 out": lambda: spatialc.rmsnorm(20, 130, "fp16", weight=False, out="bf16"),
    "map": lambda: spatialc.elementwise(ew.silu(G) * X, 70, 300, "bf16"),
    "map with a column": lambda: spatialc.elementwise(ew.exp(X) / (1.0 + ew.sigmoid(G)) + ew.col("b"), 50, 200, "fp16"),
    "gemm epilogue": lambda: spatialc.gemm(
        96, 160, 64, "bf16", epilogue=[spatialc.bias(), spatialc.activation("gelu_tanh")]
    ),
    "map with a row": lambda: spatialc.elementwise(ew.exp(X) * ew.row("s") + ew.col("b") * G, 70, 300, "fp16"),
    "layernorm": lambda: spatialc.layernorm(40, 300, "bf16"),
    "gemm row scale, residual": lambda: spatialc.gemm(
        96, 160, 64, "bf16", epilogue=[spatialc.row_scale(), spatialc.col_scale(), spatialc.residual()]
    ),
}


def inputs_of(p: spatialc.SpatialProgram, rng: np.random.Generator) -> dict[str, np.ndarray]:
    values = {}
    for t in p.tensors:
        if t.role.value != "output":
            x = rng.normal(size=t.elems).astype(np.float32) * 4
            x.reshape(-1)[rng.integers(0, x.size, size=6)] = [np.nan, np.inf, -np.inf, -0.0, 1e-40, 3e38]
            values[t.name] = x
    return values


def run(p: spatialc.SpatialProgram, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output by name (a program of one output too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = spatialc.evaluate(p, values)
    return out if isinstance(out, dict) else {"out": out}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_pages_computed_together_equal_pages_computed_alone(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    p = spatialc.build(PROGRAMS[name](), "sm_90")
    values = inputs_of(p, np.random.default_rng(len(name)))
    batched: list[int] = []
    with monkeypatch.context() as m:  # (and count the batches: the lazy path is taken)
        m.setattr(
            mapped,
            "_realise_runs",
            lambda runs, *rest, f=mapped._realise_runs: batched.append(len(runs)) or f(runs, *rest),
        )
        together = run(p, values)
    assert batched
    monkeypatch.setattr(mapped, "_runs_as_written", lambda expr, by_row: False)  # every map page by page
    alone = run(p, values)
    assert together.keys() == alone.keys()
    for name, got in together.items():
        assert got.dtype == alone[name].dtype and got.shape == alone[name].shape
        assert got.tobytes() == alone[name].tobytes(), name
