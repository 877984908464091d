"""The GPU check: build, run, check and time spatialc's kernels against cuBLAS and Triton in one short GPU run.

    spatialc gpucheck DIR --prepare                     # here, with nvcc: compile every kernel beforehand
    spatialc gpucheck OUTDIR --prepared DIR [--budget 240] [--sizes 256 1000 4097x513x1031 …] [--dry-run]

First a preflight of at most a minute tries every path once (the device, CuPy's cuBLAS, spatialc's kernel in each
form, each library in the layout the rows use, CUDA graphs, a Triton compile); a path that fails is marked
unavailable, with its reason, and the run goes on with the rest. Then for every size × precision (int8, fp16, bf16)
it builds `gemm(m, n, k, p)` for the target (storing C in torch's type where gemm takes `out`) and lowers it to its
kernels, the persistent kernel and the same program in the general form (where lower prints one; the report says why
not) and, on an sm_90 target, the same GEMM built for sm_90a in the sm_90a form (TMA and wgmma: its own plan,
compiled for sm_90a), loads each one's prepared cubin (after checking its source hash) or compiles it, runs each on
fresh random inputs with the output poisoned first, compares C with a float64 reference, and times each kernel, as a
contestant of its own, and each library two ways, like for like: end to end (row-major A and B in, row-major C out
in torch's type, tilize / untilize and every copy included) and kernel only (operands in each contestant's own
layout; CUDA graph replays, so that small products are not timed by their launching). Inputs rotate over copies so
that the L2 cache does not flatter them. Each row also records its plan and each kernel's budget and what ptxas said
of it (registers, spills, static shared memory), shown in a kernel table, a line per form, whose notes flag spills
and register counts that cost resident blocks. The report warns when the device has fewer SMs than the target plans
for.

The table goes to stdout and, as JSON and Markdown, to OUTDIR, which is checked and created before the first row
and rewritten after the preflight and every row (rows not reached yet are marked pending), so a run cut short still
leaves what it finished. It stops at `--budget` seconds (the preflight included): background compiles get no more
than the time left and are killed at the end, rows not reached are marked skipped and the table is still written;
Ctrl-C or SIGTERM stops it the same way. Exit status: 0 all run rows correct, 1 some wrong or failed (or the report
could not be written; the table and the JSON then go to stdout; with --prepare: some kernel did not compile), 2 no
GPU or a bad argument (one line on stderr; without a GPU it names the `--dry-run` that works anyway), 3 the GPU hung
or lost its context and no restart could go on (or the run ran a minute past its budget and was killed), 130
interrupted (the table is written first). The rows run in a worker process: when a kernel or library hangs or leaves
a sticky CUDA error, a fresh worker goes on without it (at most `--restarts` times, 2 by default; 0 runs everything
in this process), keeping the rows finished and running the one it was lost on again; the report's header lists
each restart. As it goes, stderr says which preflight step and
which row starts (`gpucheck: row 3/24: fp16 256x256x256, 41 s so far`) and stdout how each one ended.

Map rows (`map:KIND:MxN`: SwiGLU's gate, a residual add, gelu; softmax and RMSNorm, which reduce rows) time
programs with no matmul in GB/s of the bytes they must read and write: spatialc's general form against torch's
formula and a device-to-device copy of as many bytes (the device's copy bandwidth), in a table of their own.

The package: `cases` (the shared value types), `driver` (command line, budget loop, dry run), `preflight`,
`prepare` (cubins and their manifest), `restart` (the worker processes, and going on after a lost GPU), `builds`
(building and compiling in the background), `timing`, `device`
(CuPy and torch: launching, checking, timing), `baselines` (the libraries, by their rules), `grouped`, `sweep`,
`maps`, `norms` and `maprows` (the rows of their own kinds), `fp8` and `blockscaled` (fp8 GEMMs with dequant scales,
DeepGEMM's block scales `fp8bs:`, MXFP8's `fp8mx:`), `groupedbs` (block-scaled grouped GEMMs, `fp8bs:KIND:gG:…`),
`w4rows`, `w4measure` and `w4refs` (W4A16's: 4-bit weights against torch's mm on them dequantised and the copy
bandwidth, `w4:FORMAT:MxNxK`; the references `--prepare` saves for them), `rates`, `report` and `maptable` (the
tables), `triton_ref`.
Only `device`, `baselines`' library calls, the rows' measuring and `triton_ref` need a GPU; the rest is tested on a
CPU with fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def main(argv: Sequence[str] | None = None, make_runner: Callable[..., Any] | None = None) -> int:
    """`spatialc gpucheck …`: the GPU check's entry point (tests pass a fake `make_runner`)."""
    from .driver import main as driver_main

    return driver_main(argv, make_runner, description=(__doc__ or "").splitlines()[0])


__all__ = ["main"]
