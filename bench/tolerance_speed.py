"""The tolerance check of a row program at 2048 × 2048 — softmax, RMSNorm, LayerNorm — against numpy computing the same
function and against the interpreter computing it.

`spatialc.tolerance(p).check(out, inputs)` computes the float64 reference and each element's bound (every op's
interval image over its operands' boxes, every row reduction's exact sum and bound, carried stage to stage:
numerics/tolerance.py). numpy computes the function once in float64 on the same bf16-rounded inputs. Each of the
three is timed in the same run, interleaved, median of RUNS, CPU time of this process (the VM is shared: wall time
swings with its neighbours). Issue 31: the check was ~8× the interpreter at this size.

Usage: python bench/tolerance_speed.py [m n]
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import numpy as np

import spatialc
from spatialc.numerics.rounding import round_bf16

RUNS = 5
EPS = 1e-5


def numpy_softmax(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def numpy_rmsnorm(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    return (x / np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS) * v["weight"]).astype(np.float32)


def numpy_layernorm(v: dict[str, np.ndarray]) -> np.ndarray:
    x = v["x"].astype(np.float64)
    c = x - x.mean(axis=1, keepdims=True)
    return (c / np.sqrt((c * c).mean(axis=1, keepdims=True) + EPS) * v["weight"] + v["bias"]).astype(np.float32)


PROGRAMS = {
    "softmax": (lambda m, n: spatialc.softmax(m, n), numpy_softmax),
    "rmsnorm": (lambda m, n: spatialc.rmsnorm(m, n, eps=EPS), numpy_rmsnorm),
    "layernorm": (lambda m, n: spatialc.layernorm(m, n, eps=EPS), numpy_layernorm),
}


def main() -> None:
    m, n = (int(v) for v in sys.argv[1:3]) if len(sys.argv) >= 3 else (2048, 2048)
    rng = np.random.default_rng(0)
    for name, (make, numpy_of) in PROGRAMS.items():
        p = spatialc.build(make(m, n), "sm_90")
        inputs = {"x": rng.normal(size=(m, n)).astype(np.float32)}
        for t in p.tensors:
            if t.role.value == "parameter":
                inputs[t.name] = rng.normal(size=n).astype(np.float32)
        values = {k: round_bf16(v).astype(np.float32) if k == "x" else v for k, v in inputs.items()}
        tol = spatialc.tolerance(p)
        check, interp, plain = [], [], []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", spatialc.InexactInputWarning)
            for _ in range(RUNS):
                t0 = time.process_time()
                out = spatialc.evaluate(p, inputs)
                t1 = time.process_time()
                ok, how = tol.check(out, inputs)
                t2 = time.process_time()
                numpy_of(values)
                t3 = time.process_time()
                interp.append(t1 - t0)
                check.append(t2 - t1)
                plain.append(t3 - t2)
        assert ok, f"{name}: {how}"
        tc, ti, tn = (statistics.median(v) for v in (check, interp, plain))
        print(
            f"{name:9s} {m}x{n} bf16: check {tc * 1e3:7.1f} ms   interpreter {ti * 1e3:7.1f} ms   numpy"
            f" {tn * 1e3:6.1f} ms   check/numpy {tc / tn:5.1f}x   check/interpreter {tc / ti:4.1f}x  (median of {RUNS})"
        )


if __name__ == "__main__":
    main()
