"""The host cost of a cached call of a spatialc.torch op, against torch.mm, on the CPU.

A cached call does no build and no verify: it checks its tensors (dtype, shape, contiguity, device), reads the sizes
off them, finds the built program in its cache and runs it. On the CPU "runs it" is the reference interpreter, so
the op's whole time says little about a GPU; this script also times the op with the interpreter replaced by an
empty result, which leaves what the op itself costs around a kernel (torch's dispatch, spatialc's checks, the cache
lookup). Median of N calls each, interleaved.

    python bench/torch_overhead.py            # or: python bench/torch_overhead.py M N K
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import spatialc.torch as sct


def median_us(fn, calls: int = 200) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main(m: int = 64, n: int = 64, k: int = 64) -> None:
    op = sct.gemm_op("bf16", bias=True, activation="relu")
    a, b, bias = torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16(), torch.randn(n)
    af, bf = a.float(), b.float()
    op(a, b, bias)  # the first call builds (and says so with logging at INFO)
    [entry] = [e for e in op.compiled() if e.sizes == (m, n, k)]
    whole = median_us(lambda: op(a, b, bias))
    real = sct.SpatialOp._evaluate
    empty = torch.empty(m, n)
    sct.SpatialOp._evaluate = lambda self, entry, named: empty.clone()  # the interpreter left out
    try:
        host = median_us(lambda: op(a, b, bias))
    finally:
        sct.SpatialOp._evaluate = real
    mm = median_us(lambda: torch.relu(torch.addmm(bias, af, bf)))
    print(f"{m}x{n}x{k} bf16 gemm + bias + relu, CPU; built once in {entry.seconds:.3f} s ({entry.source})")
    print(f"  torch.addmm + relu (float32)        {mm:9.1f} us")
    print(f"  spatialc op, interpreter            {whole:9.1f} us")
    print(f"  spatialc op, host part (no interp.) {host:9.1f} us   ({len(op.compiled())} program(s) built)")


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:4]))
