"""The CuPy pieces the GPU runner is made of: CUDA events with a hang limit, CUDA graphs through stream capture,
a device that loads prepared cubins, and spatialc's end-to-end path (what `spatialc.run` does on the device).

Imported only where a GPU run happens (the objects take the `cupy` module, or the tests' stand-in, as an argument).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpatialError
from ..runtime import launch, nvcc
from ..runtime.tilize import bf16_bits
from .cases import GpuHung, one_line
from .prepare import source_hash
from .timing import GraphUnavailable


class EventTimer:
    """CUDA events on the current stream."""

    def __init__(self, cp: Any, clock: Callable[[], float] = time.monotonic):
        self.cp, self.clock = cp, clock

    def mark(self) -> Any:
        e = self.cp.cuda.Event()
        e.record()
        return e

    def elapsed_s(self, start: Any, end: Any) -> float:
        return float(self.cp.cuda.get_elapsed_time(start, end)) / 1e3

    def wait(self, mark: Any, limit_s: float) -> None:
        t0 = self.clock()
        while not mark.done:
            if self.clock() - t0 > limit_s:
                raise GpuHung(f"the GPU did not finish within {limit_s:.0f} s (a deadlocked kernel?)")
            time.sleep(0.0002)
        mark.synchronize()  # raises the kernel's error, if it had one


class CupyGraphs:
    """CUDA graphs through CuPy's stream capture (relaxed mode) on the stream all work goes to; the replay runs on
    it too, between the timing's events."""

    def __init__(self, stream: Any):
        self.stream = stream

    def capture(self, batch: Callable[[], None]) -> Callable[[], None]:
        stream = self.stream
        try:
            stream.begin_capture()
        except Exception as e:
            raise GraphUnavailable(one_line(e)) from None
        failed: BaseException | None = None
        try:
            batch()
        except Exception as e:  # the capture must still be ended, or the stream stays capturing
            failed = e
        try:
            graph = stream.end_capture()
        except Exception as e:
            raise GraphUnavailable(one_line(failed or e)) from None
        if failed is not None:
            raise GraphUnavailable(one_line(failed))
        return lambda: graph.launch(stream)


class PreparedDevice:
    """The CuPy device, loading a kernel from its prepared cubin (by source hash) instead of compiling its text."""

    def __init__(self, base: Any, cp: Any):
        self.base, self.cp, self.xp = base, cp, base.xp
        self.cubins: dict[str, Path] = {}
        self.loaded: dict[str, Any] = {}

    @property
    def sms(self) -> int | None:
        """The device's multiprocessors, which the kernels' work lists follow (None: the plan's grid)."""
        return getattr(self.base, "sms", None)

    def load(self, kernel_cu: str, kernel_name: str, dyn_smem: int) -> Any:
        path = self.cubins.get(source_hash(kernel_cu))
        if path is None:
            return self.base.load(kernel_cu, kernel_name, dyn_smem)
        if str(path) not in self.loaded:
            symbol = nvcc.kernel_symbol(path.read_bytes(), kernel_name)
            kernel = self.cp.RawModule(path=str(path)).get_function(symbol)
            if launch.needs_smem_attribute(dyn_smem):
                kernel.max_dynamic_shared_size_bytes = dyn_smem
            self.loaded[str(path)] = kernel
        return self.loaded[str(path)]

    def cubin_of(self, kernel_cu: str) -> Path | None:
        """The cubin `load` loaded: the prepared one (its ptxas numbers beside it), else the base device's."""
        path = self.cubins.get(source_hash(kernel_cu))
        if path is not None:
            return path
        base = getattr(self.base, "cubin_of", None)
        return None if base is None else base(kernel_cu)

    @property
    def arch(self) -> str | None:
        """The device's architecture, which the launcher checks a kernel's (clusters, sm_90a) against."""
        return getattr(self.base, "arch", None)

    def launch(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple[Any, ...]) -> None:
        self.base.launch(kernel, grid, block, dyn_smem, args)

    def upload(self, x: Any) -> tuple[Any, bool | str]:
        """`x` on the device, as the base device uploads it (`launch.uploaded`: a W4A16 row's host-laid bytes)."""
        return self.base.upload(x)

    # What a split-K row's cooperative kernel and a multicast row's clusters need of the device: without them the
    # launcher refuses the first (it cannot launch cooperatively, or tell whether all its sites fit) and cannot
    # check the second against the clusters the device holds at once.
    def occupancy(self, kernel: Any, block: int, dyn_smem: int) -> int | None:
        occupancy = getattr(self.base, "occupancy", None)
        return None if occupancy is None else occupancy(kernel, block, dyn_smem)

    def clusters_at_once(self, kernel: Any, grid: int, block: int, dyn_smem: int) -> int | None:
        ask = getattr(self.base, "clusters_at_once", None)
        return None if ask is None else ask(kernel, grid, block, dyn_smem)

    def launch_cooperative(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple[Any, ...]) -> None:
        cooperative = getattr(self.base, "launch_cooperative", None)
        if cooperative is None:
            raise launch.LaunchError(
                "this device cannot launch a kernel whose sites wait on each other (cooperatively)"
            )
        cooperative(kernel, grid, block, dyn_smem, args)

    def tensor_map(self, *spec: Any) -> Any:
        """An sm_90a kernel's tensor map, encoded by the CuPy device."""
        return self.base.tensor_map(*spec)


@dataclass
class Inputs:
    """A row's input sets: row-major A and B in their storage dtype (bf16 as uint16 bits), and in `more` each set's
    other tensors by name, stored alike (a fused epilogue's residual, row and column scales: fused.more_inputs)."""

    a: list[Any]
    b: list[Any]
    more: list[dict[str, Any]] = field(default_factory=list)

    def named(self, i: int) -> dict[str, Any]:
        """Set `i`'s tensors by the names kernels give them: A, B and the others."""
        return {"A": self.a[i], "B": self.b[i], **(self.more[i] if self.more else {})}


def kernel_tensors(prep: Any, named: dict[str, Any], out: Any, xp: Any) -> tuple[Any, ...]:
    """A GEMM kernel's arguments from row-major tensors by name (`Inputs.named`), whichever of them it takes (a plain
    GEMM A and B, a fused one its epilogue's too): each input tiled as stored, each parameter tiled from its values
    as float32 (the kernel's type for a scale; bf16 bits read as their values), with `out` in parameter order."""
    ins = tuple(prep.tiled(a, named[a.name]) for a in prep.args if a.role == "input")
    params = {
        a.name: prep.tiled(a, parameter_values(a, named[a.name], xp).reshape(a.elems))
        for a in prep.args
        if a.role == "parameter"
    }
    return prep.order(ins, out, params)


def parameter_values(arg: Any, x: Any, xp: Any) -> Any:
    """A parameter's stored values: float32 (`float32_values`), or an e8m0 parameter's codes e + 127 (uint8) from its
    values 2^e (an MX row's scales: powers of two, exact in float32), as `runtime.w4_args` lays them out."""
    values = float32_values(x, xp)
    if arg.elem != "float8_e8m0fnu":
        return values
    return (xp.log2(values).astype(xp.int32) + 127).astype(xp.uint8)


def float32_values(x: Any, xp: Any) -> Any:
    """A stored array's values as float32: bf16 bits (uint16) exactly, others converted."""
    if x.dtype == xp.uint16:
        from ..runtime.tilize import bf16_to_float32

        return bf16_to_float32(x, xp)
    return x.astype(xp.float32)


class SpatialcEndToEnd:
    """What spatialc.run does on the device for row-major tensors (A, B and any other the kernel takes): tilize each,
    launch, untilize C and convert it to torch's output type; `result` holds the last C."""

    def __init__(self, prep: Any, inputs: Inputs, want: str, xp: Any):
        self.prep, self.inputs, self.want, self.xp = prep, inputs, want, xp
        self.result: Any = None

    def __call__(self, i: int) -> None:
        p = self.prep
        out = p.output_buffer(poison=False)
        p.run(kernel_tensors(p, self.inputs.named(i), out, self.xp))
        self.result = convert(p.result(out), p.output.elem, self.want, self.xp)


def convert(c: Any, have: str, want: str, xp: Any) -> Any:
    """C of element type `have` as `want` (torch's output type): rounded to nearest even, or narrowed exactly."""
    if have == want:
        return c
    if want == "bfloat16":
        return bf16_bits(c.astype(xp.float32), xp)
    if want in ("float16", "int32"):
        return c.astype(want)
    raise SpatialError(f"no conversion of C from {have} to {want}")
