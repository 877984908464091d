"""The GPU check's device side: CuPy runs and times spatialc's kernels, torch and Triton the baselines.

Imported only on a machine that runs the check (it needs CuPy; torch and Triton are used when present). Every wait
on the GPU polls an event with a limit, so a deadlocked kernel becomes `GpuHung` instead of a hung process. The
kernels compile in background threads; each nvcc gets no more than the budget's time left, and `close` cancels the
compiles not started and kills the nvcc processes still running, so the run ends within its budget.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gpucheck import (
    BudgetExceeded,
    Built,
    Case,
    Deadline,
    GpuHung,
    GpuLost,
    build_case,
    check_result,
    compile_kernel,
    copies_for,
    int_mm_takes,
    one_line,
    time_launches,
)
from .gpucheck_report import Baseline, Row
from .runtime import launch
from .runtime.tilize import bf16_bits, bf16_to_float32, poison_value

TARGET_OF_CC = {"80": "sm_80", "86": "sm_86", "89": "sm_89", "90": "sm_90"}
HANG_S = 60.0  # a wait longer than this is a hung kernel …
HANG_MIN_S = 10.0  # … and never shorter than this, even when the budget is nearly spent
# Errors after which the CUDA context is unusable ("sticky"): every later call would fail too.
STICKY = re.compile(
    r"illegal|misaligned|launch ?fail|unspecified launch|hardware ?stack|\bECC\b|uncorrectable|"
    r"cudaErrorAssert|device-side assert|LaunchTimeout",
    re.IGNORECASE,
)
BASELINE_REL_TOL = 1e-2  # torch.matmul rounds C to fp16/bf16, so its own check is loose
COMPILE_S = 300.0  # the most one nvcc may take …
COMPILE_GRACE_S = 2.0  # … and never past the deadline plus this (the deadline keeps RESERVE_S ≥ this back)
MIN_COMPILE_S = 1.0  # an nvcc is not started with less than this left
CLOSE_WAIT_S = 2.0  # how long `close` waits for the killed compiles' threads to finish


class EventTimer:
    """CUDA events on CuPy's current stream (set to torch's, so both libraries' work is ordered on one stream)."""

    def __init__(self, cp: Any, clock: Callable[[], float] = time.monotonic):
        self.cp, self.clock = cp, clock

    def mark(self) -> Any:
        e = self.cp.cuda.Event()
        e.record()
        return e

    def elapsed_s(self, start: Any, end: Any) -> float:
        return self.cp.cuda.get_elapsed_time(start, end) / 1e3

    def wait(self, mark: Any, limit_s: float) -> None:
        t0 = self.clock()
        while not mark.done:
            if self.clock() - t0 > limit_s:
                raise GpuHung(f"the GPU did not finish within {limit_s:.0f} s (a deadlocked kernel?)")
            time.sleep(0.0002)
        mark.synchronize()  # raises the kernel's error, if it had one


@dataclass
class Inputs:
    """A row's input sets: operands in storage dtype, their tiled copies, and float64 values of set 0."""

    a: list[Any]
    b: list[Any]
    a_tiled: list[Any]
    b_tiled: list[Any]


class GpuRunner:
    """Runs the check's rows on the current CUDA device."""

    def __init__(self, target: str | None, *, seed: int = 0, triton: bool = True, workers: int | None = None):
        self.cp = launch.require_cupy()  # GpuUnavailable when there is none
        self.device = launch.cupy_device()
        self.torch = _import_torch()
        self.stream = None
        if self.torch is not None:  # one stream for both libraries, so events order them
            self.stream = self.cp.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream)
            self.stream.use()
        self.triton, self.triton_note = _import_triton(self.torch) if triton else (None, "disabled (--no-triton)")
        cc = str(self.cp.cuda.Device().compute_capability)
        self.arch = f"sm_{cc}"
        self.target = target or TARGET_OF_CC.get(cc, "sm_90")
        self.timer = EventTimer(self.cp)
        self.seed = seed
        self.pool = ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 2))
        self.builds: dict[Case, Future[Built]] = {}
        self.deadline: Deadline | None = None
        self.closed = False

    # ---- description ---------------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """GPU name, SMs, clocks, memory and library versions, for the report's header."""
        rt = self.cp.cuda.runtime
        props = rt.getDeviceProperties(rt.getDevice())
        name = props.get("name", b"?")
        return {
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "sms": props.get("multiProcessorCount"),
            "compute_capability": self.arch,
            "target": self.target,
            "memory_gib": round(props.get("totalGlobalMem", 0) / 2**30, 1),
            "l2_mib": round(self._l2_bytes() / 2**20, 1),
            "clocks": _clocks(props),
            "versions": self._versions(),
        }

    def _l2_bytes(self) -> int:
        rt = self.cp.cuda.runtime
        return int(rt.getDeviceProperties(rt.getDevice()).get("l2CacheSize") or 50 * 2**20)

    def _versions(self) -> str:
        parts = [f"cupy {self.cp.__version__}", f"driver {self.cp.cuda.runtime.driverGetVersion()}"]
        if self.torch is not None:
            parts.append(f"torch {self.torch.__version__}")
        parts.append(f"triton {self.triton.VERSION}" if self.triton is not None else f"triton: {self.triton_note}")
        nvcc = launch.find_nvcc()
        parts.append(f"nvcc {launch.nvcc_version(nvcc)}" if nvcc else "nvcc: none (NVRTC)")
        return ", ".join(parts)

    # ---- rows ----------------------------------------------------------------------------------------------

    def start(self, cases: Sequence[Case], deadline: Deadline) -> None:
        """Build, lower and compile every case in the background while the GPU runs earlier rows; no compile runs
        past `deadline` (plus COMPILE_GRACE_S)."""
        self.deadline = deadline
        for case in cases:
            if case not in self.builds:
                self.builds[case] = self.pool.submit(self._build, case)

    def close(self) -> None:
        """Cancel the builds not started, kill the nvcc processes still running, and wait (briefly) for their threads,
        so that neither this call nor the interpreter's exit waits on a compile."""
        if self.closed:
            return
        self.closed = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        kill_compiles()
        running = [f for f in self.builds.values() if not f.done()]
        if running:
            wait_futures(running, timeout=CLOSE_WAIT_S)

    def _compile_limit(self) -> float:
        """Seconds the next nvcc may take: COMPILE_S, cut to the time left before the deadline (plus the grace)."""
        if self.deadline is None:
            return COMPILE_S
        return min(COMPILE_S, self.deadline.left() + COMPILE_GRACE_S)

    def _build(self, case: Case) -> Built:
        built = build_case(case, self.target)
        if built.artifact is None:
            return built
        if launch.find_nvcc() is None:
            built.kernel["ptxas"] = "no nvcc (NVRTC)"
            return built
        limit = self._compile_limit()
        if self.closed or limit < MIN_COMPILE_S:
            built.error = "compile: not started: time budget spent"
            return built
        try:
            compile_kernel(built, self.arch, timeout_s=limit)
        except launch.KernelBuildError as e:
            built.error = "compile: stopped at the end of the run" if self.closed else f"compile: {e}"
        return built

    def run(self, case: Case, deadline: Deadline) -> Row:
        """One row: check, time, then the baselines; frees its memory whatever happens."""
        try:
            built = self.builds[case].result(timeout=max(1.0, deadline.left()))
        except FutureTimeout:
            raise BudgetExceeded() from None
        row = Row(case.precision, case.m, case.n, case.k, plan=built.plan, launch=built.launch, kernel=built.kernel)
        if built.error:
            row.status, row.note = "error", built.error
            return row
        try:
            self._measure(case, built, row, deadline)
        except (GpuLost, BudgetExceeded):
            raise
        except Exception as e:
            if STICKY.search(str(e)):
                raise GpuLost(one_line(e)) from None
            raise
        finally:
            self._free()
        return row

    def _hang_limit(self, deadline: Deadline) -> float:
        return min(HANG_S, max(HANG_MIN_S, deadline.left()))

    def _measure(self, case: Case, built: Built, row: Row, deadline: Deadline) -> None:
        cp = self.cp
        prep = launch.prepare(built.artifact, self.device)
        inputs = self._inputs(case, prep)
        ref = cp.matmul(self._values(inputs.a[0], case.precision), self._values(inputs.b[0], case.precision))
        out = prep.output_buffer(poison=True)
        arg_sets = [prep.order((inputs.a_tiled[i], inputs.b_tiled[i]), out) for i in range(len(inputs.a))]
        row.check = self._checked_run(prep, arg_sets[0], out, ref, case, deadline)
        timing = time_launches(
            lambda i: prep.run(arg_sets[i]), len(arg_sets), self.timer, limit_s=self._hang_limit(deadline)
        )
        row.median_s, row.reps = timing.median_s, timing.reps
        again = self._checked_run(prep, arg_sets[0], out, ref, case, deadline)
        row.check.stable = again.correct == row.check.correct and again.max_abs == row.check.max_abs
        row.status = "ok" if row.check.correct and row.check.stable else "wrong"
        if row.check.pad_unwritten:
            row.note = f"{row.check.pad_unwritten} padding elements unwritten"
        for baseline in self._baselines(case, inputs, ref, deadline):
            row.baselines.append(baseline)

    def _checked_run(self, prep: Any, args: tuple[Any, ...], out: Any, ref: Any, case: Case, deadline: Deadline) -> Any:
        out.fill(poison_value(prep.output.storage))
        prep.run(args)
        self.timer.wait(self.timer.mark(), self._hang_limit(deadline))
        return check_result(prep.result(out), ref, out, prep.output.storage, case.precision, self.cp)

    # ---- inputs ----------------------------------------------------------------------------------------------

    def _inputs(self, case: Case, prep: Any) -> Inputs:
        cp = self.cp
        itemsize = 1 if case.precision == "int8" else 2
        copies = copies_for((case.m * case.k + case.k * case.n) * itemsize, self._l2_bytes())
        rs = cp.random.RandomState(zlib.crc32(f"{self.seed} {case}".encode()))  # fresh per row, reproducible
        a_arg, b_arg = (x for x in prep.args if x.role == "input")
        a = [self._random(rs, (case.m, case.k), case.precision) for _ in range(copies)]
        b = [self._random(rs, (case.k, case.n), case.precision) for _ in range(copies)]
        return Inputs(a, b, [prep.tiled(a_arg, x) for x in a], [prep.tiled(b_arg, x) for x in b])

    def _random(self, rs: Any, shape: tuple[int, int], precision: str) -> Any:
        cp = self.cp
        if precision == "int8":
            return rs.randint(-128, 128, size=shape).astype(cp.int8)
        x = rs.uniform(-1.0, 1.0, size=shape, dtype=cp.float32)
        return x.astype(cp.float16) if precision == "fp16" else bf16_bits(x, cp)

    def _values(self, x: Any, precision: str) -> Any:
        """float64 values of an operand in storage dtype (exact)."""
        if precision == "bf16":
            return bf16_to_float32(x, self.cp).astype(self.cp.float64)
        return x.astype(self.cp.float64)

    def _free(self) -> None:
        self.cp.get_default_memory_pool().free_all_blocks()
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    # ---- baselines -------------------------------------------------------------------------------------------

    def _baselines(self, case: Case, inputs: Inputs, ref: Any, deadline: Deadline) -> Iterator[Baseline]:
        for name, family, make in self._baseline_makers(case, inputs):
            if deadline.passed():
                yield Baseline(name, family, note="skipped: time budget spent")
                continue
            yield self._time_baseline(name, family, make, case, ref, len(inputs.a), deadline)

    def _baseline_makers(self, case: Case, inputs: Inputs) -> Iterator[tuple[str, str, Any]]:
        if self.torch is None:
            yield "cuBLAS (torch)", "cublas", "torch is not installed"
        elif case.precision == "int8":
            yield (
                "torch._int_mm",
                "cublas",
                (lambda: self._int_mm(inputs))
                if int_mm_takes(case.m, case.n, case.k)
                else "n/a: torch._int_mm needs m > 16 and k, n multiples of 8",
            )
        else:
            yield "torch.matmul", "cublas", lambda: self._torch_matmul(inputs, case.precision)
        if case.precision == "int8":
            yield "cublasGemmEx NN", "cublas", lambda: self._gemm_ex(case, inputs, transposed_b=False)
            yield "cublasGemmEx TN", "cublas", lambda: self._gemm_ex(case, inputs, transposed_b=True)
        if self.triton is None:
            yield "Triton matmul", "triton", self.triton_note
        else:
            yield "Triton matmul", "triton", lambda: self._triton(inputs, case.precision)

    def _time_baseline(
        self, name: str, family: str, make: Any, case: Case, ref: Any, copies: int, deadline: Deadline
    ) -> Baseline:
        if isinstance(make, str):
            return Baseline(name, family, note=make)
        try:
            fn, result = make()
            fn(0)
            self.timer.wait(self.timer.mark(), self._hang_limit(deadline))
            got = result().astype(self.cp.float64)
            diff = self.cp.abs(got - ref)
            max_abs = float(diff.max())
            if case.precision == "int8":
                ok = max_abs == 0.0
            else:
                ok = float(self.cp.linalg.norm(got - ref) / self.cp.linalg.norm(ref)) <= BASELINE_REL_TOL
            if not ok:
                return Baseline(name, family, max_abs=max_abs, ok=False, note="wrong result; not timed")
            timing = time_launches(fn, copies, self.timer, limit_s=self._hang_limit(deadline))
            return Baseline(name, family, timing.median_s, max_abs, True)
        except GpuHung:
            raise
        except Exception as e:
            if STICKY.search(str(e)):
                raise GpuLost(f"{name}: {one_line(e)}") from None
            return Baseline(name, family, note=f"failed: {one_line(e)}")

    def _as_torch(self, x: Any, precision: str) -> Any:
        torch = self.torch
        if precision == "bf16":
            return torch.from_dlpack(x.view(self.cp.int16)).view(torch.bfloat16)
        return torch.from_dlpack(x)

    def _from_torch(self, t: Any) -> Any:
        return self.cp.from_dlpack(t if t.dtype != self.torch.bfloat16 else t.float())

    def _torch_matmul(self, inputs: Inputs, precision: str) -> tuple[Callable[[int], None], Callable[[], Any]]:
        a = [self._as_torch(x, precision) for x in inputs.a]
        b = [self._as_torch(x, precision) for x in inputs.b]
        c = self.torch.empty((a[0].shape[0], b[0].shape[1]), dtype=a[0].dtype, device=a[0].device)
        return (lambda i: self.torch.matmul(a[i], b[i], out=c)), (lambda: self._from_torch(c.float()))

    def _int_mm(self, inputs: Inputs) -> tuple[Callable[[int], None], Callable[[], Any]]:
        a = [self._as_torch(x, "int8") for x in inputs.a]
        b = [self._as_torch(x, "int8") for x in inputs.b]
        box: list[Any] = [None]

        def fn(i: int) -> None:
            box[0] = self.torch._int_mm(a[i], b[i])

        return fn, lambda: self._from_torch(box[0])

    def _gemm_ex(
        self, case: Case, inputs: Inputs, transposed_b: bool
    ) -> tuple[Callable[[int], None], Callable[[], Any]]:
        """int8 × int8 → int32 through cublasGemmEx. Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ, so B goes first;
        the TN form reads a stored Bᵀ (n × k), the layout cuBLAS's int8 kernels prefer."""
        import numpy as np

        cp = self.cp
        cublas = cp.cuda.cublas
        m, n, k = case.m, case.n, case.k
        bs = [cp.ascontiguousarray(x.T) for x in inputs.b] if transposed_b else inputs.b
        c = cp.empty((m, n), dtype=cp.int32)
        one, zero = np.array(1, dtype=np.int32), np.array(0, dtype=np.int32)
        handle = cp.cuda.device.get_cublas_handle()
        if hasattr(cublas, "setPointerMode"):  # alpha and beta live on the host
            cublas.setPointerMode(handle, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", 0))
        if hasattr(cublas, "setStream"):  # the stream the events are recorded on
            cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
        op_n, op_t = getattr(cublas, "CUBLAS_OP_N", 0), getattr(cublas, "CUBLAS_OP_T", 1)
        r_8i, r_32i = 3, 10  # CUDA_R_8I, CUDA_R_32I (library_types.h)
        compute_32i = getattr(cublas, "CUBLAS_COMPUTE_32I", 72)

        def fn(i: int) -> None:
            b, a = bs[i], inputs.a[i]
            cublas.gemmEx(
                handle,
                op_t if transposed_b else op_n,
                op_n,
                n,
                m,
                k,
                one.ctypes.data,
                _ptr(b),
                r_8i,
                k if transposed_b else n,
                _ptr(a),
                r_8i,
                k,
                zero.ctypes.data,
                _ptr(c),
                r_32i,
                n,
                compute_32i,
                -1,
            )

        return fn, lambda: c

    def _triton(self, inputs: Inputs, precision: str) -> tuple[Callable[[int], None], Callable[[], Any]]:
        torch = self.torch
        a = [self._as_torch(x, precision) for x in inputs.a]
        b = [self._as_torch(x, precision) for x in inputs.b]
        dtype = torch.int32 if precision == "int8" else torch.float32
        c = torch.empty((a[0].shape[0], b[0].shape[1]), dtype=dtype, device=a[0].device)
        return (lambda i: self.triton.matmul(a[i], b[i], c, precision)), (lambda: self._from_torch(c))


# ---- stopping compiles -------------------------------------------------------------------------------------------


def kill_compiles(pid: int | None = None) -> list[int]:
    """Kill this process's nvcc compiles (its children whose command line holds `-cubin`) with everything they
    started (cicc, ptxas, …): stopped first so none starts another, then killed. Returns the ids signalled; does
    nothing where there is no /proc."""
    me = os.getpid() if pid is None else pid
    hit: list[int] = []
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in _compile_tree(me):
            try:
                os.kill(p, sig)
            except OSError:
                continue
            if p not in hit:
                hit.append(p)
    return hit


def _compile_tree(root: int) -> list[int]:
    """The compile processes under `root`, children before their own children."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    todo = [p for p in children.get(root, []) if "-cubin" in _cmdline(p)]
    tree: list[int] = []
    while todo:
        p = todo.pop(0)
        tree.append(p)
        todo += children.get(p, [])
    return tree


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc (empty where there is none)."""
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path("/proc", name, "stat").read_text()
            parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _cmdline(pid: int) -> list[str]:
    try:
        return Path("/proc", str(pid), "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _ptr(x: Any) -> int:
    """A CuPy array's device address."""
    return x.data.ptr


def _import_torch() -> Any:
    try:
        import torch
    except Exception:
        return None
    return torch if torch.cuda.is_available() else None


def _import_triton(torch: Any) -> tuple[Any, str]:
    if torch is None:
        return None, "needs torch, which is not installed"
    try:
        from . import gpucheck_triton
    except Exception as e:
        return None, f"not available ({one_line(e)})"
    return gpucheck_triton, ""


def _clocks(props: dict[str, Any]) -> str:
    """SM and memory clocks: nvidia-smi's current / max when it answers, else the device properties."""
    try:
        q = "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
        )
        sm, sm_max, mem, mem_max = (v.strip() for v in out.stdout.splitlines()[0].split(","))
        return f"SM {sm}/{sm_max} MHz, memory {mem}/{mem_max} MHz (current/max, nvidia-smi)"
    except Exception:
        pass
    sm, mem = props.get("clockRate"), props.get("memoryClockRate")
    if sm:
        return f"SM {sm // 1000} MHz, memory {(mem or 0) // 1000} MHz (max, device properties)"
    return "unknown"
