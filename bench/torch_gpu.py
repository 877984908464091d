"""The GPU rows of issue 33, prepared on the CPU and not yet run: spatialc.torch ops on a CUDA device.

1. Preflight: the op on the GPU, and on the CPU (the interpreter), each within its tolerance of the reference.
2. Per-call time of a bf16 GEMM at small sizes (where the host's work dominates) and at 512³: `torch.mm` against
   the spatialc op, N calls back to back, one synchronize at the end (wall time per call), after a warm-up call.
3. A two-layer MLP block (Linear → SiLU → Linear, bf16 operands) end to end: torch's own layers and the same
   model after `replace_linears`, in eager, `torch.compile` and CUDA-graph modes — the graph captured by hand
   (`torch.cuda.graph` after a warm-up on a side stream, replayed) and by `torch.compile(mode="reduce-overhead")`;
   each graph's replay is checked against the eager output of its model before it is timed.

    python bench/torch_gpu.py [calls]          # needs torch with CUDA, CuPy and a GPU; exits 2 without one
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import spatialc
import spatialc.torch as sct

SMALL = [(64, 64, 64), (128, 128, 128), (512, 512, 512)]
MLP = (256, 1024, 4096)  # tokens, model width, hidden width


def per_call_us(fn, calls: int) -> float:
    """Wall time per call of `fn`, `calls` back to back and one synchronize, the median of 5 such runs."""
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t) / calls)
    return statistics.median(runs) * 1e6


def preflight(op, a, b) -> None:
    """The op's GPU result within the kernel's tolerance of the float64 reference, and the interpreter's (its CPU
    path) within the interpreter's, or SystemExit."""
    gpu = op(a.cuda(), b.cuda()).cpu()
    cpu = op(a, b)
    program = next(e.program for e in op.compiled() if e.sizes == (a.shape[0], b.shape[1], a.shape[1]))
    for name, c, kernel in (("gpu", gpu, True), ("cpu", cpu, False)):
        ok, how = spatialc.tolerance(program, kernel=kernel).check(c.numpy(), {"A": a, "B": b})
        print(f"preflight {op.name} {tuple(c.shape)} on the {name}: {'ok' if ok else 'WRONG'} ({how})")
        if not ok:
            raise SystemExit(1)


def main(calls: int = 200) -> None:
    if not torch.cuda.is_available():
        print("no CUDA device: this script runs where one is", file=sys.stderr)
        raise SystemExit(2)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "spatialc", spatialc.__version__)
    gemm = sct.gemm_op("bf16")
    for m, n, k in SMALL:
        a, b = torch.randn(m, k).bfloat16(), torch.randn(k, n).bfloat16()
        preflight(gemm, a, b)
        ag, bg = a.cuda(), b.cuda()
        mm = per_call_us(lambda ag=ag, bg=bg: torch.mm(ag, bg), calls)
        ours = per_call_us(lambda ag=ag, bg=bg: gemm(ag, bg), calls)
        print(f"{m}x{n}x{k} bf16: torch.mm {mm:8.1f} us/call, spatialc op {ours:8.1f} us/call ({ours / mm:.2f}x)")

    tokens, width, hidden = MLP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, width)).cuda()
    x = torch.randn(tokens, width, device="cuda")
    with torch.no_grad():
        torch_eager = per_call_us(lambda: model(x), calls // 10 or 1)
        torch_compiled = torch.compile(model)
        torch_compile = per_call_us(lambda: torch_compiled(x), calls // 10 or 1)
        sct.replace_linears(model, freeze=True)
        ours_eager = per_call_us(lambda: model(x), calls // 10 or 1)
        ours_compiled = torch.compile(model, fullgraph=True)
        ours_compile = per_call_us(lambda: ours_compiled(x), calls // 10 or 1)
        ours_graph = per_call_us(graphed(model, x), calls // 10 or 1)
        ours_overhead = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        ours_ro = per_call_us(lambda: ours_overhead(x), calls // 10 or 1)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, width)).cuda()
    with torch.no_grad():
        torch_graph = per_call_us(graphed(plain, x), calls // 10 or 1)
        torch_overhead = torch.compile(plain, mode="reduce-overhead")
        torch_ro = per_call_us(lambda: torch_overhead(x), calls // 10 or 1)
    print(f"MLP {tokens}x{width}->{hidden}->{width}: eager torch {torch_eager:.1f} us, spatialc {ours_eager:.1f} us;")
    print(f"  torch.compile: torch {torch_compile:.1f} us, spatialc {ours_compile:.1f} us;")
    print(f"  CUDA graph (by hand): torch {torch_graph:.1f} us, spatialc {ours_graph:.1f} us;")
    print(f"  torch.compile(mode='reduce-overhead'): torch {torch_ro:.1f} us, spatialc {ours_ro:.1f} us")


def graphed(model, x):
    """`model(x)` captured in a CUDA graph (after a warm-up on a side stream, as torch's docs do), its replay checked
    against an eager call (the same kernels: equal bits), and the replay to time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    graph.replay()
    torch.cuda.synchronize()
    if not torch.equal(out, model(x)):
        print(f"graph replay of {type(model).__name__} differs from its eager call: WRONG")
        raise SystemExit(1)
    return graph.replay


if __name__ == "__main__":
    main(*(int(v) for v in sys.argv[1:2]))
