"""A program family as a torch custom op: its signature read off two builder calls (`signature`), the fake (meta)
implementation, the per-shape build cache (memory and disk), the CPU path (the interpreter) and the CUDA launch."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import api
from ..errors import ProgramError, SpatialError
from ..files import read_at_most, write_whole
from ..inputs import InputError
from ..ir.nodes import SpatialProgram
from ..ir.serde import MAX_DOCUMENT_BYTES
from ..passes.declaration import declaration
from ..runtime.cache import cache_dir
from .signature import Slot, _arg_names, _call, _dims, _dtype, _kind, _qualified, _shape_of, _signature, _taken

log = logging.getLogger("spatialc.torch")


@dataclass
class Compiled:
    """One shape of a family as spatialc built it: the sizes, the device, the verified program, where it came from
    ("built", or "disk" for the JSON cache) and the seconds it took; a CUDA entry also keeps the lowered artifact and
    the loaded kernel."""

    sizes: tuple[int, ...]
    device: str
    program: SpatialProgram = field(repr=False)
    source: str
    seconds: float
    artifact: Any = field(default=None, repr=False)
    prepared: Any = field(default=None, repr=False)

    def __str__(self) -> str:
        dims = "x".join(map(str, self.sizes))
        how = "built" if self.source == "built" else "read from the disk cache"
        return f"{self.program.name} {dims} on {self.device}: {how} in {self.seconds:.2f} s"


class TracedInputError(InputError, IndexError):
    """An InputError found by an op's fake (meta) implementation, as torch.compile traces: an InputError (its one
    line, caught as any other) that is also an IndexError, the one error Dynamo lets out of fake-tensor propagation
    unwrapped (torch 2.13: every other becomes a TorchRuntimeError of many lines, its cause dropped)."""


_REGISTERED: dict[str, SpatialOp] = {}  # torch keeps an op's name for the life of the process
_LOCK = threading.Lock()


def op(
    builder: Callable[..., SpatialProgram],
    name: str,
    *,
    options: Mapping[str, Any] | None = None,
    disk_cache: bool = True,
    probes: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
) -> SpatialOp:
    """The program family `builder` (sizes → a SpatialProgram: unbuilt, or verified as `spatialc.lang` programs
    are) as the torch custom op `name` ("namespace::name"; "spatialc::" is added to a bare name). `options` go to
    `spatialc.build` (block=, form=, …). `probes` are the two sets of sizes the builder is called with to read its
    signature (each set's sizes all different, and each size different between the sets), for a family that
    refuses the default ones (a program written by hand for multiples of its block). The op is also
    `torch.ops.<namespace>.<name>`."""
    return SpatialOp(builder, name, options=options, disk_cache=disk_cache, probes=probes)


class SpatialOp:
    """A program family registered as a torch custom op; call it with tensors (see `op`)."""

    def __init__(
        self,
        builder: Callable[..., SpatialProgram],
        name: str,
        *,
        options: Mapping[str, Any] | None = None,
        disk_cache: bool = True,
        probes: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ):
        if not callable(builder):
            raise ProgramError(f"spatialc.torch.op takes a function from sizes to a program, not {_kind(builder)}")
        self.name = _qualified(name)
        self.builder = builder
        self.options = dict(options or {})
        self.disk_cache = disk_cache
        self.params, self.slots, self.outputs = _signature(builder, self.name, probes)
        self._names = [s.name for s in self.slots] + [s.name for s in self.outputs]
        # each size read off the first input axis that is it: (slot, axis)
        self._reads = [
            next((i, ax) for i, s in enumerate(self.slots) for ax, a in enumerate(s.axes) if a == p)
            for p in self.params
        ]
        self._programs: dict[tuple[int, ...], tuple[SpatialProgram, float]] = {}  # and the builder's seconds
        self._cache: dict[tuple[tuple[int, ...], str], Compiled] = {}
        with _LOCK:
            if self.name in _REGISTERED:
                raise ProgramError(f"an op named {self.name} is already defined in this process; give another name")
            self._def = torch.library.custom_op(self.name, self._impl, mutates_args=(), schema=self.schema)
            _REGISTERED[self.name] = self
        self._def.register_fake(self._fake)

    @property
    def output(self) -> Slot:
        """The program's first output (its only one, for most programs)."""
        return self.outputs[0]

    @property
    def schema(self) -> str:
        """The op's torch schema: one Tensor per input and parameter; one Tensor out, or a tuple of one per output
        in the program's order."""
        outs = "Tensor" if len(self.outputs) == 1 else f"({', '.join('Tensor' for _ in self.outputs)})"
        return f"({', '.join(f'Tensor {n}' for n in _arg_names(self.slots))}) -> {outs}"

    def __call__(self, *tensors: Any) -> Any:
        return self._def(*tensors)

    def __repr__(self) -> str:
        return f"SpatialOp({self.name}{self.schema})"

    def compiled(self) -> list[Compiled]:
        """What this op has built so far, one entry per (sizes, device), in the order it built them."""
        return list(self._cache.values())

    def register_autograd(self, backward: Callable[..., Any], setup_context: Callable[..., Any]) -> None:
        """torch.library.register_autograd for this op."""
        self._def.register_autograd(backward, setup_context=setup_context)

    # ---- what torch calls --------------------------------------------------------------------------------------

    def _fake(self, *tensors: Any) -> Any:
        """Each output's shape and dtype from the inputs' shapes alone (sizes may be symbolic): nothing is built. A
        refused input is a TracedInputError, which torch.compile's trace passes to the user as it is."""
        try:
            shapes = [self._shape(slot, t) for slot, t in zip(self.slots, tensors, strict=True)]
            # one meta tensor sends the whole call here, not to _impl: mixed devices are refused here too
            self._one_device(tensors)
        except InputError as e:
            raise TracedInputError(str(e)) from None
        sizes = self._sizes(shapes)
        made = [
            tensors[0].new_empty(
                [sizes[self.params.index(a)] if isinstance(a, str) else a for a in s.axes], dtype=s.dtype
            )
            for s in self.outputs
        ]
        return self._result({s.name: t for s, t in zip(self.outputs, made, strict=True)})

    def _result(self, by_name: Mapping[str, Any]) -> Any:
        """The op's result from its outputs by name: the one tensor, or a tuple in the program's order."""
        got = tuple(by_name[s.name] for s in self.outputs)
        return got[0] if len(got) == 1 else got

    def _impl(self, *tensors: Any) -> Any:
        shapes = [self._shape(slot, t) for slot, t in zip(self.slots, tensors, strict=True)]  # each a tensor first
        device = self._device(tensors)
        sizes = tuple(int(s) for s in self._sizes(shapes))
        program = self._program(sizes)
        for slot, t, shape in zip(self.slots, tensors, shapes, strict=True):
            want = _taken(slot, program.tensor_named(slot.name))
            if tuple(shape) != want:
                raise InputError(f"{self.name}: {slot.name} is {_dims(shape)}; at these sizes it must be {_dims(want)}")
            if not t.is_contiguous():
                raise InputError(
                    f"{self.name}: {slot.name} is not contiguous (strides {tuple(t.stride())}); pass .contiguous()"
                )
        entry = self._entry(sizes, str(device))
        named = {
            slot.name: t.detach().reshape(_shape_of(program.tensor_named(slot.name)))
            for slot, t in zip(self.slots, tensors, strict=True)
        }
        if device.type == "cpu":
            return self._evaluate(entry, named)
        return self._launch(entry, named, device)

    # ---- checks ------------------------------------------------------------------------------------------------

    def _shape(self, slot: Slot, t: Any) -> tuple[Any, ...]:
        """`t`'s shape as the program's tensor has it (a row parameter given as 1-D gets its row axis), once its
        dtype and rank are checked."""
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{self.name}: {slot.name} is {_kind(t)}; pass a torch tensor")
        if t.dtype != slot.dtype:
            raise InputError(f"{self.name}: {slot.name} is {_dtype(t.dtype)}; this op takes {_dtype(slot.dtype)}")
        shape = tuple(t.shape)
        if slot.row and len(shape) == 1:
            shape = (1, *shape)
        if len(shape) != len(slot.axes):
            # A row parameter (LayerNorm's weight and bias) is taken 1-D too: say both ranks, not only the program's.
            takes = "1 (its columns) or 2 (one row of them)" if slot.row else f"{len(slot.axes)}"
            raise InputError(f"{self.name}: {slot.name} has {t.dim()} dimension(s) {_dims(t.shape)}; it takes {takes}")
        return shape

    def _sizes(self, shapes: list[tuple[Any, ...]]) -> list[Any]:
        """The builder's arguments, each read off the first input axis that is it."""
        return [shapes[i][ax] for i, ax in self._reads]

    def _one_device(self, tensors: tuple[Any, ...]) -> Any:
        """The one device all `tensors` are on."""
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise InputError(f"{self.name}: tensors on {' and '.join(sorted(map(str, devices)))}; pass them on one")
        return devices.pop()

    def _device(self, tensors: tuple[Any, ...]) -> Any:
        device = self._one_device(tensors)
        if device.type not in ("cpu", "cuda"):
            raise InputError(f"{self.name}: spatialc runs on cpu (its interpreter) and cuda; these are on {device}")
        return device

    # ---- building, once per shape ------------------------------------------------------------------------------

    def _program(self, sizes: tuple[int, ...]) -> SpatialProgram:
        """The family's program at `sizes` (the builder's own errors, such as a size below one, pass)."""
        if sizes not in self._programs:
            start = time.perf_counter()
            p = _call(self.builder, self.name, sizes)
            if sorted(t.name for t in p.tensors) != sorted(self._names):
                raise ProgramError(f"{self.name}: the family's tensors change with its sizes; it cannot be one op")
            self._programs[sizes] = (p, time.perf_counter() - start)
        return self._programs[sizes][0]

    def _entry(self, sizes: tuple[int, ...], device: str) -> Compiled:
        key = (sizes, device)
        with _LOCK:
            entry = self._cache.get(key)
            if entry is None:
                start = time.perf_counter()
                built, source = self._build(self._program(sizes))
                seconds = time.perf_counter() - start + self._programs[sizes][1]  # a lang builder traces, verifies
                entry = Compiled(sizes, device, built, source, seconds)
                self._cache[key] = entry
                log.info("spatialc.torch: %s: %s", self.name, entry)
        return entry

    def _build(self, program: SpatialProgram) -> tuple[SpatialProgram, str]:
        """The verified program: from the disk cache where it holds one (verified again as it is read, and held to
        declare what `program` declares: a file there may have been put by someone else), else built and stored
        there. A program the builder verified itself (spatialc.lang's) is used as it is."""
        if program.verified:
            return program, "built"
        path = self._cached_path(program) if self.disk_cache else None
        if path is not None and path.is_file():
            try:
                text = read_at_most(path, MAX_DOCUMENT_BYTES)
                kept = api.from_json(text.decode()) if text is not None else None
                if kept is not None and kept.verified and declaration(kept) == declaration(program):
                    return kept, "disk"
            except (OSError, SpatialError, ValueError):
                pass  # a damaged or stale entry is built again and overwritten
        built = api.build(program, program.target, **self.options)
        if path is not None:
            with contextlib.suppress(OSError):  # a read-only cache costs a rebuild next time, nothing else
                path.parent.mkdir(parents=True, exist_ok=True)
                write_whole(path, api.to_json(built))
        return built, "built"

    def _cached_path(self, program: SpatialProgram) -> Path:
        from .. import __version__

        key = "\n".join((__version__, repr(sorted(self.options.items())), api.to_json(program)))
        return cache_dir("torch") / f"{hashlib.sha256(key.encode()).hexdigest()}.json"

    # ---- running -----------------------------------------------------------------------------------------------

    def _evaluate(self, entry: Compiled, named: dict[str, Any]) -> Any:
        """The interpreter's exact result (CPU tensors in, CPU tensors out)."""
        import numpy as np

        c = api.evaluate(entry.program, named)
        got = c if isinstance(c, dict) else {self.outputs[0].name: c}
        return self._shaped(
            entry, {s.name: torch.from_numpy(np.ascontiguousarray(got[s.name])).to(s.dtype) for s in self.outputs}
        )

    def _launch(self, entry: Compiled, named: dict[str, Any], device: Any) -> Any:
        """The kernel on torch's current stream of `device`: lowered and loaded at the first call of a shape, its
        buffers from torch's allocator. Inside CUDA-graph capture the shape must have run once before (the warm-up
        torch's graphs and `mode="reduce-overhead"` make), and nothing is read back to check the inputs."""
        with torch.cuda.device(device), _stream(torch.cuda.current_stream(device)), _torch_memory():
            capturing = _capturing()  # the tensors' device's current stream (made current above)
            if capturing and entry.prepared is None:
                raise InputError(
                    f"{self.name}: the first call at sizes {'x'.join(map(str, entry.sizes))} is inside CUDA-graph"
                    " capture, where its kernel cannot be built and loaded; call the op once at these sizes before"
                    " capturing (a warm-up)"
                )
            got = launch_entry(entry, named, _gpu_device(), checked=not capturing)
            return self._shaped(entry, _by_name(got, self.outputs[0].name))

    def _shaped(self, entry: Compiled, by_name: Mapping[str, Any]) -> Any:
        """The result, each output shaped as the fake implementation gives it (a group axis of one kept)."""
        return self._result(
            {s.name: by_name[s.name].reshape(_taken(s, entry.program.tensor_named(s.name))) for s in self.outputs}
        )


def _by_name(got: Any, only: str) -> dict[str, Any]:
    return got if isinstance(got, dict) else {only: got}


def launch_entry(entry: Compiled, named: dict[str, Any], gpu: Any, *, checked: bool = True) -> Any:
    """Run `entry`'s kernel on `gpu` (a runtime.launch Device) with the tensors by name, lowering and preparing it
    once; C comes back as a torch tensor of the output's dtype, or, for a kernel of several outputs, a dict of them
    by name in the program's order (as `spatialc.run` gives). `checked=False`: nothing read back to the host
    (`runtime.launch.run_prepared`), as inside CUDA-graph capture."""
    from ..runtime import launch

    if entry.prepared is None:
        entry.artifact = api.lower(entry.program)
        prepared = launch.prepare(entry.artifact, gpu)
        prepared.workspaces()  # made now, from the model's pool: never first inside a graph's, which it would outlive
        entry.prepared = prepared
    c = launch.run_prepared(entry.prepared, entry.artifact, checked=checked, **named)
    if isinstance(c, dict):
        return {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in c.items()}
    return c if isinstance(c, torch.Tensor) else torch.as_tensor(c)


def _gpu_device() -> Any:
    from ..runtime.launch import cupy_device

    return cupy_device()


def _capturing() -> bool:
    """Whether torch's current CUDA stream is capturing a graph (`torch.cuda.graph`, `mode="reduce-overhead"`)."""
    return torch.cuda.is_available() and bool(torch.cuda.is_current_stream_capturing())


def torch_allocation(size: int, *, empty: Callable[..., Any], cupy: Any) -> Any:
    """A CuPy MemoryPointer to `size` bytes that torch's caching allocator gives (`empty`: `torch.empty` on the
    current device and stream), owned by the torch tensor, so the memory goes back to torch when CuPy drops it.
    Inside capture torch gives it from the graph's private pool: what makes a captured launch's copies replayable."""
    block = empty(max(size, 1), dtype=torch.uint8)
    memory = cupy.cuda.UnownedMemory(block.data_ptr(), size, block)
    return cupy.cuda.MemoryPointer(memory, 0)


@contextlib.contextmanager
def _torch_memory() -> Iterator[None]:
    """CuPy's allocations (the tiled copies of the inputs, the outputs' buffers) taken from torch's allocator for
    the call: one pool with the model's tensors, and the graph's own pool inside capture (CuPy's pool would call
    cudaMalloc, which capture forbids)."""
    from ..runtime.launch import require_cupy

    cupy = require_cupy()
    device = torch.cuda.current_device()

    def allocate(size: int) -> Any:
        return torch_allocation(size, empty=lambda *a, **k: torch.empty(*a, device=device, **k), cupy=cupy)

    with cupy.cuda.using_allocator(allocate):
        yield


@contextlib.contextmanager
def _stream(stream: Any) -> Iterator[None]:
    """CuPy's current stream set to torch's `stream` (CuPy launches and copies on its current stream)."""
    from ..runtime.launch import require_cupy

    cupy = require_cupy()
    with cupy.cuda.ExternalStream(stream.cuda_stream, stream.device_index):
        yield
