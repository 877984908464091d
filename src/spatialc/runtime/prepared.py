"""A loaded kernel and its argument contract (`Prepared`): tilize operands, poison an output, launch, read C back;
and the checks that a kernel whose sites wait on each other (or run as clusters) fits the device at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .arguments import Arg
from .tilize import TILE, LaunchError, poison_value, tilize, untilize

# ---- the device --------------------------------------------------------------------------------------------


class Device(Protocol):
    """What the launcher needs of a GPU; CupyDevice is the real one, tests pass a numpy stand-in."""

    xp: Any

    # (device array, what its bits hold: True bf16's, "float8_e4m3fn" / "float8_e5m2" torch fp8's, else False)
    def upload(self, x: Any) -> tuple[Any, bool | str]: ...

    def download(self, x: Any, library: str, like: Sequence[Any]) -> Any: ...

    def load(self, kernel_cu: str, kernel_name: str, dyn_smem: int) -> Any: ...

    def launch(self, kernel: Any, grid: int, block: int, dyn_smem: int, args: tuple[Any, ...]) -> None: ...

    # A cooperative launch (every block resident at once) goes through `launch_cooperative`, which a device that
    # runs such kernels has (CupyDevice does).


@dataclass
class Prepared:
    """A loaded kernel and its argument contract: tilize operands, poison an output, launch, read C back."""

    device: Any
    kernel: Any
    launch_spec: Any
    args: list[Arg]
    grid: int = 0  # the blocks to launch: one per site the device runs
    work: Any = None  # the work list on the device, the kernel's last argument (None: a kernel printed without one)
    sync: Any = None  # sites that hand over to each other: their sync words, set before each launch, passed last
    # … set from this copy of their initial values, made on the device once: a device-to-device copy is captured
    # into a CUDA graph as it is, where one from the host goes through a staging buffer CuPy recycles after capture.
    sync_init: Any = None
    spaces: dict[str, Any] | None = None  # each workspace tensor's device buffer (split-K's partial sums)
    encoded: dict[tuple[int, Any], Any] = field(default_factory=dict)  # tensor maps by (index, buffer address)
    clusters_held: int | None = None  # a cluster kernel's clusters the device holds at once (None: not asked)

    @property
    def xp(self) -> Any:
        return self.device.xp

    @property
    def outputs(self) -> list[Arg]:
        """The kernel's outputs in parameter order (LayerNorm's out, mean and rstd; most kernels' one C)."""
        return [a for a in self.args if a.role == "output"]

    @property
    def output(self) -> Arg:
        """The first output: a kernel of one output's C."""
        return self.outputs[0]

    def output_arg(self, name: str | None = None) -> Arg:
        """The output `name` (None: the first)."""
        if name is None:
            return self.output
        found = next((a for a in self.outputs if a.name == name), None)
        if found is None:
            raise LaunchError(f"this kernel has no output {name!r}; its outputs: {', '.join(self.output_names)}")
        return found

    @property
    def output_names(self) -> list[str]:
        return [a.name for a in self.outputs]

    def tiled(self, arg: Arg, x: Any) -> Any:
        """The device-side tiled copy of `x`, already in `arg`'s storage dtype."""
        return tilize(x, arg.tiles, self.xp, _tile(self.launch_spec), arg.order, arg.groups)

    def output_buffer(self, poison: bool = True, name: str | None = None) -> Any:
        """A tiled buffer for the output `name` (None: the first), filled with a value no result can take when
        `poison`."""
        out = self.output_arg(name)
        rt, ct = out.tiles
        tr, tc = _tile(self.launch_spec)
        buf = self.xp.empty(rt * ct * tr * tc, dtype=out.storage)
        if poison:
            buf.fill(poison_value(out.storage))
        return buf

    def output_buffers(self, poison: bool = True) -> dict[str, Any]:
        """A tiled buffer for every output, by name (`output_buffer` of each)."""
        return {a.name: self.output_buffer(poison, a.name) for a in self.outputs}

    def order(self, inputs: Sequence[Any], out: Any, params: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
        """Tiled buffers in the kernel's parameter order: `out` the output's buffer, or a dict of every output's by
        name (`output_buffers`; a kernel of several outputs takes only that)."""
        it, params, spaces = iter(inputs), params or {}, self.workspaces()
        outs = out if isinstance(out, Mapping) else None
        if outs is None and len(self.outputs) > 1:
            raise LaunchError(f"this kernel has {len(self.outputs)} outputs: pass a buffer for each, by name")
        tensors = tuple(
            (out if outs is None else outs[a.name])
            if a.role == "output"
            else next(it)
            if a.role == "input"
            else spaces[a.name]
            if a.role == "workspace"
            else params[a.name]
            for a in self.args
        )
        return (*tensors, *self.extra())

    def extra(self) -> tuple[Any, ...]:
        """What the kernel takes after its tensors (and before its tensor maps): the work list, then the sync words,
        those it has."""
        return tuple(x for x in (self.work, self.sync) if x is not None)

    def workspaces(self) -> dict[str, Any]:
        """The workspace buffers, made (zeroed) at first use and kept: the kernel writes every element it reads."""
        if self.spaces is None:
            tr, tc = _tile(self.launch_spec)
            self.spaces = {
                a.name: self.xp.zeros(a.tiles[0] * a.tiles[1] * tr * tc, dtype=a.storage)
                for a in self.args
                if a.role == "workspace"
            }
        return self.spaces

    def run(self, args: tuple[Any, ...]) -> None:
        """Launch once (asynchronously) with the kernel's arguments (`order`'s or `launch.uploaded`'s: the buffers in
        parameter order, then the work list and sync words); a kernel whose sites wait on each other has its sync
        words set (arrival counts to 0, semaphores to their initial values) and is launched cooperatively; an sm_90a
        kernel gets its tensor maps, encoded over these buffers, after them."""
        ls = self.launch_spec
        args = (*args, *self.tensor_maps(args))
        if self.sync is not None:
            self.xp.copyto(self.sync, self.sync_init)  # on the device: a graph's every replay resets them
        if not getattr(ls, "cooperative", False):
            self.device.launch(self.kernel, self.grid or ls.grid, ls.block, ls.dyn_smem, args)
            return
        cooperative = getattr(self.device, "launch_cooperative", None)
        if cooperative is None:
            raise LaunchError("this device cannot launch a kernel whose sites wait on each other (cooperatively)")
        try:
            cooperative(self.kernel, self.grid, ls.block, ls.dyn_smem, args)
        except Exception as e:
            if "COOPERATIVE_LAUNCH_TOO_LARGE" in str(e).upper().replace(" ", "_"):
                raise LaunchError(not_resident(self.grid, getattr(self.device, "sms", None))) from None
            raise

    def tensor_maps(self, args: tuple[Any, ...]) -> list[Any]:
        """The kernel's TMA tensor maps (`Launch.tensor_maps`) over the tensor buffers among `args`, encoded by the
        device (its `tensor_map(buffer, dims, strides, box, elem, swizzle)`), in parameter order. A map depends on
        nothing but its buffer's address, so one encoded over a device buffer is kept for later launches on it (the
        GPU check's timed loops launch on the same buffers again and again)."""
        maps = getattr(self.launch_spec, "tensor_maps", ())
        if not maps:
            return []
        encode = getattr(self.device, "tensor_map", None)
        if encode is None:
            raise LaunchError("this device cannot encode the TMA tensor maps an sm_90a kernel takes")
        out = []
        for m in maps:
            at = m.tensor  # its parameter's position
            arg = self.args[at]
            elem = self.xp.dtype(arg.storage).itemsize
            ptr = getattr(getattr(args[at], "data", None), "ptr", None)  # a CuPy buffer's device address
            key = (m.index, ptr)
            if ptr is None or key not in self.encoded:
                dims, strides, box = m.geometry(arg.tiles, elem)
                self.encoded[key] = encode(args[at], dims, strides, box, elem, m.swizzle)
            out.append(self.encoded[key])
        return out

    def check(self) -> None:
        """After a launch (it waits for it): LaunchError when a loop count read from data was beyond its bound."""
        at = getattr(self.launch_spec, "trip_error", -1)
        if self.sync is None or at < 0:
            return
        flag, count = (int(x) for x in self.sync[at : at + 2].tolist())
        if flag:
            raise LaunchError(f"a loop count read from data is {count}, beyond its bound; the loop ran no times")

    def result(self, out: Any, name: str | None = None) -> Any:
        """The logical values of the output `name`'s tiled buffer (None: the first output's; still on the device)."""
        o = self.output_arg(name)
        return untilize(out, o.tiles, o.elems, self.xp, _tile(self.launch_spec), o.order, o.groups)


def _tile(launch: Any) -> tuple[int, int]:
    return tuple(getattr(launch, "tile", TILE))  # type: ignore[return-value]


def check_clusters(device: Any, kernel: Any, ls: Any, grid: int) -> int | None:
    """The clusters of a cluster kernel the device holds at once (the driver's answer; None where it gives none),
    or LaunchError when the kernel launches more: its sites are placed for one wave, and the clusters past what the
    device holds would run after the others finish, a second wave that nearly doubles the time."""
    ask = getattr(device, "clusters_at_once", None)
    held = None if ask is None else ask(kernel, grid, ls.block, ls.dyn_smem)
    launched = grid // ls.cluster
    if held is not None and launched > held:
        raise LaunchError(
            f"this kernel launches {launched} thread-block clusters of {ls.cluster} sites, and this device holds"
            f" {held} at once (cuOccupancyMaxActiveClusters): the rest would wait for a second wave; build it over"
            f" sites={held * ls.cluster} (--sites {held * ls.cluster})"
        )
    return held


def check_resident(device: Any, kernel: Any, ls: Any, grid: int) -> None:
    """LaunchError unless every one of `grid` blocks of a kernel whose sites wait on each other is known to be
    resident at once. Where the device cannot say how many it holds, the launch is refused rather than risked: CUDA
    itself may refuse an oversized cooperative grid, but CuPy shrinks it (with a warning), and the sites left out
    are waited for forever."""
    if getattr(device, "launch_cooperative", None) is None:
        raise LaunchError("this device cannot launch a kernel whose sites wait on each other (cooperatively)")
    occupancy = getattr(device, "occupancy", None)  # blocks of this kernel one multiprocessor holds
    sms = getattr(device, "sms", None)
    per_sm = None if occupancy is None or sms is None else occupancy(kernel, ls.block, ls.dyn_smem)
    if per_sm is None:
        raise LaunchError(residency_unknown(grid))
    if sms * per_sm < grid:
        raise LaunchError(not_resident(grid, sms, per_sm))


def residency_unknown(sites: int) -> str:
    """Why a kernel whose sites wait on each other is not launched where the device cannot say what it holds."""
    return (
        f"the {sites} sites of this kernel wait on each other, so all must be resident at once, and this device"
        " does not say how many of its blocks it holds (no occupancy answer): refused rather than risk a hang"
    )


def not_resident(sites: int, sms: int | None, per_sm: int | None = None) -> str:
    """Why a kernel whose sites wait on each other cannot run here."""
    held = f"{sms * per_sm} ({sms} SMs x {per_sm} blocks)" if sms is not None and per_sm is not None else "fewer"
    return (
        f"the {sites} sites of this kernel wait on each other, so all must be resident at once; this device holds"
        f" {held}: place the program over fewer sites"
    )
