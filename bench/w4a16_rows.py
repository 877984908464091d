"""W4A16 decode rows (issue 34 item 8): M ∈ {1, 16, 64}, N = K ∈ {4096, 14336}, int4 (bf16 scale and int4 zero per
128 rows) and mxfp4 (e8m0 scale per 32), prepared on the CPU; on a GPU, measured against torch.

Each row's spatialc program is built and verified here, its plan printed (decode shapes: see what the planner
chose), and its kernel printed (auto prints the general form; the persistent and sm_90a forms print it when asked).
What a row reads at least once: the packed weights (K·N / 2 bytes), their scales and zero points, A and C.

The rows, their inputs and torch's baseline are the GPU check's (`spatialc.gpucheck.w4rows`: `python -m
spatialc.gpucheck OUT --sizes w4:int4:1x4096x4096 …` measures the same rows, each C checked); this script is the
quick look. With `--gpu` (torch with CUDA), in one run on one device, for each row:
- torch: `torch.mm(A, W)` in bf16 on the row's own weights dequantised beforehand (`w4rows.operands`; what a
  framework without a W4A16 kernel runs: the dequantised copy is 4× the packed bytes);
- the copy-bandwidth ceiling: `dst.copy_(src)` of the packed weights' bytes, timed; a copy moves each byte twice, so
  the device's copy bandwidth is 2·bytes / time, and the ceiling is the row's bytes read once at that bandwidth;
- spatialc: the row's kernel (auto's: the general form), built for the device's architecture and loaded by
  `spatialc.run`'s launcher — and on a Hopper the sm_90a form's too (`form="sm90a"`, target sm_90a); its
  arguments (the packed weights laid out on the host as the host program lays them out, scales, zero points, A) are
  uploaded once and the kernel alone is launched again and again (`Prepared.run`), as torch's mm is;
- spatialc's persistent form: the row built and printed with form="persistent" (its own plan: no split-K), timed
  the same way, and the ratio general/persistent (above 1: the persistent form faster; bench/README.md, "W4A16:
  persistent against general", predicts it).
Each time is the median of 20 runs after a warm-up, CUDA events around the call, all in one run on one device. The
ratios printed are the ceiling's time over torch's and over spatialc's (1.0: at the bandwidth bound), and torch's
over spatialc's (above 1: spatialc faster); the goal for spatialc is ceiling/spatialc ≥ 0.85 at M = 1.

    python bench/w4a16_rows.py            # dry run: the rows, their bytes, plans and the kernel line
    python bench/w4a16_rows.py --gpu      # the measured rows (needs torch with CUDA and a GPU)
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass

import numpy as np

import spatialc
from spatialc.gpucheck import w4rows
from spatialc.gpucheck.w4rows import DEFAULT_FORMATS, MS, SIDES


@dataclass(frozen=True)
class Row:
    m: int
    n: int
    k: int
    fmt: str

    @property
    def name(self) -> str:
        return f"w4:{self.fmt}:{self.m}x{self.n}x{self.k}"

    @property
    def weights(self) -> str:
        return self.fmt  # (as the GPU check's cases name it)

    def bytes_read(self) -> int:
        """The packed weights, their scales (bf16, or e8m0's one byte) and zero points (a byte each: the GPU check's
        `weight_bytes`), A and C in bf16: what the kernel reads and writes at least once."""
        return w4rows.weight_bytes(self.fmt, self.n, self.k) + 2 * self.m * self.k + 2 * self.m * self.n


def rows(ms=MS, sides=SIDES, formats=DEFAULT_FORMATS) -> list[Row]:
    return [Row(m, s, s, f) for f in formats for s in sides for m in ms]


def program(row: Row, target: str = "sm_90", form: str = "auto") -> spatialc.SpatialProgram:
    """The row's W4A16 GEMM (the GPU check's: C in bf16), built and verified for `target`, planned for `form`
    ("sm90a": on an sm_90a target)."""
    return spatialc.build(w4rows.gemm_of(row), target, form=form)


def prepared(row: Row) -> tuple[str, str]:
    """(the plan, the kernel line) of the row's program, built and verified for sm_90."""
    p = program(row)
    assert p.verified and p.plan is not None
    b, g = p.plan.block, p.plan.grid
    assert p.placement is not None
    split = f", split-K {p.placement.splits}" if p.placement.splits > 1 else ""
    sub = p.plan.sub_blocks
    subs = f" of {sub[0]}x{sub[1]} sub-blocks" if sub != (1, 1) else ""
    plan = f"block {b.osh}x{b.osw}x{b.ibw}{subs}, grid {g[0]}x{g[1]}{split}, {len(p.placement.sites)} sites"
    try:
        art = spatialc.lower(p)
        kernel = f"printed ({art.budget.form} form)"
        kernel += f", launched by spatialc.run's launcher: {launch_line(art, p)}"
    except spatialc.SpatialError as e:
        kernel = str(e).split(":", 1)[0]
    return plan, kernel


CHECKED_HERE = 1 << 24  # weights up to 4096² are bound by the launcher in the dry run (larger: GiBs of float64)


def launch_line(art, p: spatialc.SpatialProgram) -> str:
    """What --gpu launches of the kernel: its arguments as the launcher binds them (the 4-bit ones laid out on the
    host), bound here on the CPU without a device for weights up to CHECKED_HERE values."""
    from spatialc.runtime import launch as L

    k, n = next(x.elems for x in L.kernel_args(art.launch) if x.packed)
    if k * n > CHECKED_HERE:
        return "timed beside torch (its arguments bound on the GPU machine)"
    bound, _ = L.bound_operands(art, (), w4rows.inputs(p))
    host = sum(1 for _, v in bound if isinstance(v, L.HostBytes))
    return f"{len(bound)} arguments bound ({host} laid out as 4-bit bytes on the host), timed beside torch"


def dry_run(selected: list[Row]) -> list[str]:
    lines = [f"{'row':28} {'MB read':>8}  plan / kernel"]
    for row in selected:
        plan, kernel = prepared(row)
        lines.append(f"{row.name:28} {row.bytes_read() / 1e6:8.2f}  {plan}; kernel: {kernel}")
    return lines


def _median_ms(torch, fn) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def spatialc_ms(torch, row: Row, form: str = "auto") -> float:
    """spatialc's kernel of the row in `form` on this device, its arguments uploaded once, the kernel alone timed;
    `form` "sm90a": the sm_90a form's (lower/cuda/sm90a/dequant.py), on target sm_90a."""
    from spatialc.runtime import launch as L

    major, minor = torch.cuda.get_device_capability()
    hopper = "a" if form == "sm90a" else ""
    p = program(row, f"sm_{major}{minor}{hopper}", form)
    art = spatialc.lower(p, form=form)
    prep = L.prepare(art)
    bound, _ = L.bound_operands(art, (), w4rows.inputs(p))
    buffers, _ = L.uploaded(prep, bound)
    prep.run(buffers)
    prep.check()  # once: a loop count past its bound would say so
    return _median_ms(torch, lambda: prep.run(buffers))


def measured(row: Row) -> str:
    """One row on the GPU: torch's bf16 mm on the dequantised weights and spatialc's kernel, against the
    copy-bandwidth ceiling."""
    import torch

    dev = "cuda"
    p = program(row)
    a64, b64 = w4rows.operands(p, w4rows.inputs(p))  # A and the weights dequantised (bf16 values, exactly)
    a = torch.from_numpy(a64.astype(np.float32)).to(dev, torch.bfloat16)
    w = torch.from_numpy(b64.astype(np.float32)).to(dev, torch.bfloat16)
    c = torch.empty(row.m, row.n, dtype=torch.bfloat16, device=dev)
    packed = torch.randint(0, 256, (row.k // 2, row.n), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(packed)
    mm = w4rows.torch_mm(torch, a, [w], c)
    t_mm = _median_ms(torch, lambda: mm(0))
    t_copy = _median_ms(torch, lambda: dst.copy_(packed))
    bandwidth = 2 * packed.numel() / (t_copy * 1e-3)  # bytes a second: a copy reads and writes each byte
    ceiling = row.bytes_read() / bandwidth * 1e3
    try:
        t_sc = spatialc_ms(torch, row)
        ours = (
            f"spatialc {t_sc * 1e3:8.1f} us   ceiling/spatialc {ceiling / t_sc:.2f}   torch/spatialc {t_mm / t_sc:.2f}"
        )
    except spatialc.SpatialError as e:  # one line: what the launcher or the device refused
        t_sc, ours = None, f"spatialc: {str(e).splitlines()[0]}"
    try:
        t_pe = spatialc_ms(torch, row, "persistent")
        ours += f"   persistent {t_pe * 1e3:8.1f} us" + (f"   general/persistent {t_sc / t_pe:.2f}" if t_sc else "")
    except spatialc.SpatialError as e:
        ours += f"   persistent: {str(e).splitlines()[0]}"
    if torch.cuda.get_device_capability()[0] == 9:  # a Hopper: the sm_90a form's kernel too, in the same run
        try:
            t_90 = spatialc_ms(torch, row, "sm90a")
            ours += f"   sm90a {t_90 * 1e3:8.1f} us   ceiling/sm90a {ceiling / t_90:.2f}"
            ours += f"   general/sm90a {t_sc / t_90:.2f}" if t_sc else ""
        except spatialc.SpatialError as e:
            ours += f"   sm90a: {str(e).splitlines()[0]}"
    return (
        f"{row.name:28} torch.mm {t_mm * 1e3:8.1f} us   ceiling {ceiling * 1e3:8.1f} us ({bandwidth / 1e12:.2f} TB/s"
        f" copy)   ceiling/torch {ceiling / t_mm:.2f}   {ours}"
    )


def main(argv: list[str]) -> int:
    selected = rows()
    if "--gpu" not in argv:
        print("\n".join(dry_run(selected)))
        return 0
    try:
        import torch
    except ImportError:
        print("w4a16_rows: --gpu needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("w4a16_rows: --gpu needs a CUDA device", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name())
    for row in selected:
        print(measured(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
