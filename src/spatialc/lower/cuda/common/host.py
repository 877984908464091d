"""The host side of the printed programs (docs/kernel-abi.md): `program_cu` runs the kernel on files and prints C;
`bench_cu` times it on fixed inputs and prints `GOPS <value>`. Every runtime call goes through SPATIALC_CHECK.

Shared by every CUDA backend: the host programs are printed from the program's tensors and the kernel's `Launch`
alone (its name, block, dynamic shared memory and each argument's C type), whatever the kernel looks like inside."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ....files import write_whole
from ....inputs import row_limits
from ....ir.ids import TensorId
from ....ir.names import plain
from ....ir.nodes import DType, SpatialProgram, Tensor, TensorRole, TileOrder
from ....ir.ops import Attention, ChoreoOp, Loop, Trip, walk
from ....passes.attention import attention_shape, attention_stage
from ....passes.cols import is_col_program
from ....passes.maps import is_map_program
from ....passes.rows import is_row_program
from ...artifact import MATRIX_ORDERS, Budget, CudaArtifact, Launch, operand_files
from ...census import census
from ...errors import InternalError
from .cwriter import Writer, inlined
from .dequant import BYTE_C_TYPES, HOST_FORMAT, PACKED_C_TYPES, PACKED_TILE, is_packed
from .program import distinct_lists

BENCH_ITERS = 20
C_BYTES = {
    "signed char": 1,
    "__nv_fp8_e4m3": 1,
    "__nv_fp8_e5m2": 1,
    "__half": 2,
    "__nv_bfloat16": 2,
    "int": 4,
    "float": 4,
    "long long": 8,
}
INTEGER_OUTPUTS = ("long long", "int", "signed char")


def helpers(launch: Launch) -> str:
    """The checked-in host helpers, inlined so that each program is one self-contained text (with the matrix
    store where a parameter is stored as a matrix, the Hilbert curve where the launch deals items along it)."""
    matrices = any(param.order in MATRIX_ORDERS for param in launch.params)
    w4 = any(param.c_type in (*PACKED_C_TYPES.values(), *BYTE_C_TYPES.values()) for param in launch.params)
    text = inlined("common/host.cuh") + ("\n" + inlined("common/matrix_host.cuh") if matrices else "")
    if launch.placement == "hilbert" and not launch.work:
        text += "\n" + inlined("common/hilbert_host.cuh")
    return text + ("\n" + inlined("common/w4_host.cuh") if w4 else "")


def assemble(
    p: SpatialProgram,
    target: str,
    kernel_cu: str,
    programs: tuple[tuple[ChoreoOp, ...], ...],
    launch: Launch,
    budget: Budget,
) -> CudaArtifact:
    """The artifact of a kernel text printed from `programs`: the census checked (every op printed once, or an
    InternalError before a wrong kernel is handed out) and the host programs around the kernel."""
    counted = census(programs, kernel_cu)
    if not counted.agrees:
        raise InternalError(
            f"the {budget.form} kernel's census disagrees: program {counted.program} with stages {counted.stages}, "
            f"printed {counted.printed} with stages {counted.printed_stages}"
        )
    host = kernel_cu + "\n" + helpers(launch) + "\n"
    return CudaArtifact(
        target, host + program_main(p, launch), host + bench_main(p, launch), kernel_cu, launch, budget, counted
    )


def input_files(p: SpatialProgram) -> dict[int, str]:
    """The file each tensor program_cu reads is read from (by tensor id): `operand_files`, made from positions."""
    files = operand_files([t.role.value for t in p.tensors])
    return {int(t.id): f for t, f in zip(p.tensors, files, strict=True) if f is not None}


def out_type(launch: Launch) -> str:
    """The C type of the output tensor's elements."""
    return next(q.c_type for q in launch.params if q.role == TensorRole.OUTPUT.value)


def _trips(p: SpatialProgram, t: Tensor) -> list[tuple[int, int]]:
    """(element, bound) of each loop count the program reads from `t`."""
    assert p.schedule is not None
    found = {
        (op.count.index, op.count.bound)
        for ops in distinct_lists(p)
        for op in walk(ops)
        if isinstance(op, Loop) and isinstance(op.count, Trip) and op.count.tensor == t.id
    }
    return sorted(found)


def _elems(t: Tensor) -> str:
    return f"(size_t){t.tiles[0]} * {t.tiles[1]} * 256"


def _device_tensors(p: SpatialProgram, launch: Launch, w: Writer, bench: bool) -> None:
    """Read (or make) each input, tilize it with zero padding, and copy it to the device; allocate the output."""
    files = input_files(p)
    limits = row_limits(p)
    for t, param in zip(p.tensors, launch.params, strict=True):
        ty = param.c_type
        i = int(t.id)
        if t.role in (TensorRole.OUTPUT, TensorRole.WORKSPACE):  # written by the kernel (a workspace: read back)
            w.line(f"{ty}* d{i} = nullptr;")
            w.line(f"SPATIALC_CHECK(cudaMalloc(&d{i}, {_elems(t)} * sizeof({ty})));")
            w.line(f"SPATIALC_CHECK(cudaMemset(d{i}, 0, {_elems(t)} * sizeof({ty})));")
            continue
        w.line(f"std::vector<double> h{i}((size_t){t.groups * t.elems[0]} * {t.elems[1]});")
        if bench:
            w.line(f"spatialc_bench_input(h{i}, {i});")
            for index, bound in _trips(p, t):  # a loop count read from data: its largest, the whole work
                w.line(f"h{i}[{index}] = {bound};")
            if t.name in limits:  # row counts: every group full
                w.line(f"for (size_t g = 0; g < h{i}.size(); ++g) {{ h{i}[g] = {limits[t.name]}; }}")
        else:
            w.line(f'if (!spatialc_read("{files[i]}", h{i})) {{ return 2; }}')
            if t.name in limits:
                w.line(f"const long long out{i} = spatialc_count_out(h{i}, {limits[t.name]});")
                _exit_if(
                    w,
                    f"out{i} >= 0",
                    f"tensor {plain(t.name)}: group %lld has %g rows; each group's row count lies in"
                    f" 0..{limits[t.name]} (its max_rows)",
                    f"out{i}, h{i}[(size_t)out{i}]",
                )
        if is_packed(t):  # 4-bit weights: packed two a byte along K, a tile of 128 bytes (common/dequant.py)
            w.line(f"std::vector<{ty}> x{i}((size_t){t.tiles[0]} * {t.tiles[1]} * {PACKED_TILE});  // zero padding")
            shape = f"{t.elems[0]}, {t.elems[1]}, {t.tiles[1]}, x{i}, {HOST_FORMAT[t.dtype]}"
            w.line(f"spatialc_tilize_w4(h{i}, {shape});")
            _copy_in(i, ty, w)
            continue
        w.line(f"std::vector<{ty}> x{i}({_elems(t)});  // zero padding: value-initialised")
        col = ", true" if t.order == TileOrder.COL else ""
        if t.dtype == DType.E5M2:  # its ±inf kept (host.cuh's spatialc_e5m2_of), where a cast saturates them
            col = f"{col or ', false'}, spatialc_e5m2_of<{ty}>()"
        stored = param.order
        if stored == "rows" and t.groups > 1:  # a head after another, each padded to its tile rows
            shape = f"{t.groups}, {t.elems[0]}, {t.elems[1]}, {t.group_tiles[0]}, {t.tiles[1] * 16}"
            w.line(f"spatialc_store_matrix_groups(h{i}, {shape}, x{i});")
        elif stored in MATRIX_ORDERS:  # a matrix the copy engine loads: padded, transposed for "cols"
            pitch = t.tiles[0] * 16 if stored == "cols" else t.tiles[1] * 16
            flip = "true" if stored == "cols" else "false"
            w.line(f"spatialc_store_matrix(h{i}, {t.elems[0]}, {t.elems[1]}, {pitch}, x{i}, {flip});")
        elif t.groups > 1 and t.dtype == DType.E8M0:  # a grouped MXFP8 GEMM's scales: each group's codes
            shape = f"{t.groups}, {t.elems[0]}, {t.elems[1]}, {t.group_tiles[0]}, {t.tiles[1]}"
            w.line(f"spatialc_tilize_groups(h{i}, {shape}, x{i}, false, spatialc_e8m0_of());")
        elif t.groups > 1:
            shape = f"{t.groups}, {t.elems[0]}, {t.elems[1]}, {t.group_tiles[0]}, {t.tiles[1]}"
            w.line(f"spatialc_tilize_groups(h{i}, {shape}, x{i}{col});")
        elif t.dtype == DType.E8M0:  # scales 2^e as their codes
            w.line(f"spatialc_tilize(h{i}, {t.elems[0]}, {t.elems[1]}, {t.tiles[1]}, x{i}, false, spatialc_e8m0_of());")
        else:
            w.line(f"spatialc_tilize(h{i}, {t.elems[0]}, {t.elems[1]}, {t.tiles[1]}, x{i}{col});")
        _copy_in(i, ty, w)


def _copy_in(i: int, ty: str, w: Writer) -> None:
    """Tensor i's host copy x{i} into a device buffer d{i}."""
    w.line(f"{ty}* d{i} = nullptr;")
    w.line(f"SPATIALC_CHECK(cudaMalloc(&d{i}, x{i}.size() * sizeof({ty})));")
    w.line(f"SPATIALC_CHECK(cudaMemcpy(d{i}, x{i}.data(), x{i}.size() * sizeof({ty}), cudaMemcpyHostToDevice));")


def _launch(p: SpatialProgram, launch: Launch, w: Writer, note: str = "") -> None:
    """One launch. A kernel with sync words gets them set first (arrival counts and error flags to 0, semaphores
    to their initial values); one whose sites hand over to each other is launched cooperatively (every block
    resident at once, or it fails)."""
    args = [f"d{int(t.id)}" for t in p.tensors] + ["d_work"] + (["d_sync"] if launch.sync else [])
    args += [f"tmap_{m.index}" for m in launch.tensor_maps]
    if launch.sync:
        reset = "cudaMemcpyAsync(d_sync, d_sync_init, sizeof(sync_init), cudaMemcpyDeviceToDevice, 0)"
        w.line(f"SPATIALC_CHECK({reset});{note}  // in stream order: no wait on the host")
        note = ""
    if not launch.cooperative:
        dyn = f", {launch.dyn_smem}" if launch.dyn_smem else ""
        w.line(f"{launch.kernel_name}<<<GRID, {launch.block}{dyn}>>>({', '.join(args)});{note}")
        return
    w.line(f"void* args[] = {{{', '.join(f'&{a}' for a in args)}}};")
    w.line(
        f"SPATIALC_CHECK(cudaLaunchCooperativeKernel({launch.kernel_name}, dim3(GRID), dim3({launch.block}), args, "
        f"{launch.dyn_smem}, 0));"
    )


def _co_resident(launch: Launch, w: Writer) -> None:
    """Refuse, before launching, a device that cannot hold every site at once: they wait on each other."""
    w.line("int sms_here = 0, per_sm = 0;")
    w.line("SPATIALC_CHECK(cudaDeviceGetAttribute(&sms_here, cudaDevAttrMultiProcessorCount, 0));")
    w.line(
        f"SPATIALC_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, {launch.kernel_name}, "
        f"{launch.block}, {launch.dyn_smem}));"
    )
    _exit_if(
        w,
        "(long long)sms_here * per_sm < GRID",
        "the %d sites of this kernel wait on each other, so all must be resident at once; this device holds %d"
        " (%d SMs x %d blocks)",
        "GRID, sms_here * per_sm, sms_here, per_sm",
    )


def _clusters_here(launch: Launch, w: Writer) -> None:
    """Refuse, before launching, a device without thread-block clusters (before sm_90) for a multicast kernel."""
    w.line("int cc_major = 0;")
    w.line("SPATIALC_CHECK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));")
    _exit_if(
        w,
        "cc_major < 9",
        "this kernel runs its multicast groups as thread-block clusters of %d sites, which need sm_90; this"
        " device's compute capability is %d.x",
        f"{launch.cluster}, cc_major",
    )


def _exit_if(w: Writer, condition: str, message: str, args: str) -> None:
    """`if (condition)`: one line `spatialc: message` (printf-formatted with `args`) on stderr, and exit status 1."""
    with w.block(f"if ({condition})"):
        w.line(f'fprintf(stderr, "spatialc: {message}\\n", {args});')
        w.line("return 1;")


def _sync_words(launch: Launch, w: Writer) -> None:
    """The kernel's sync words on the device, and their values before a launch."""
    initial = ", ".join(map(str, launch.sync))
    w.line(
        f"static const int sync_init[] = {{{initial}}};  // counts and error flags at 0, semaphores at their initial"
    )
    w.line("int* d_sync = nullptr;")
    w.line("int* d_sync_init = nullptr;")
    w.line("SPATIALC_CHECK(cudaMalloc(&d_sync, sizeof(sync_init)));")
    w.line("SPATIALC_CHECK(cudaMalloc(&d_sync_init, sizeof(sync_init)));")
    w.line("SPATIALC_CHECK(cudaMemcpy(d_sync_init, sync_init, sizeof(sync_init), cudaMemcpyHostToDevice));")


def _trip_check(launch: Launch, w: Writer) -> None:
    """After a launch: a loop count read from data outside its bound is an error, reported in one line."""
    if launch.trip_error < 0:
        return
    w.line("int trip_error[2] = {0, 0};")
    w.line(
        f"SPATIALC_CHECK(cudaMemcpy(trip_error, d_sync + {launch.trip_error}, sizeof(trip_error), "
        "cudaMemcpyDeviceToHost));"
    )
    why = "a loop count read from data is %d, beyond its bound; the loop ran no times"
    _exit_if(w, "trip_error[0]", why, "trip_error[1]")


def _work(launch: Launch, w: Writer) -> None:
    """The work list for the sites this device has (the placement rule again), or the program's own list."""
    if launch.work:
        w.line(f"static const int work_listed[] = {{{', '.join(map(str, launch.work))}}};")
        w.line(f"std::vector<int> work(work_listed, work_listed + {len(launch.work)});")
        w.line(f"const int GRID = {launch.grid};")
    else:
        w.line("int sms = 0;")
        w.line("SPATIALC_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));")
        w.line(f"const int GRID = spatialc_sites({launch.items}, sms, {launch.per_sm}, {launch.grid});")
        ny, nx = launch.item_grid
        if launch.placement == "hilbert":  # hilbert_host.cuh's, inlined for it
            w.line(f"std::vector<int> work = spatialc_hilbert_work_list({launch.items}, GRID, {ny}, {nx});")
        else:
            rule = ("contiguous", "round_robin", "grouped").index(launch.placement)
            grouped = f", {ny}, {nx}, {launch.band}" if rule == 2 else ""
            w.line(f"std::vector<int> work = spatialc_work_list({launch.items}, GRID, {rule}{grouped});")
    w.line("int* d_work = nullptr;")
    w.line("SPATIALC_CHECK(cudaMalloc(&d_work, work.size() * sizeof(int)));")
    w.line("SPATIALC_CHECK(cudaMemcpy(d_work, work.data(), work.size() * sizeof(int), cudaMemcpyHostToDevice));")


def _setup(p: SpatialProgram, launch: Launch, w: Writer, bench: bool) -> None:
    """Everything before the first launch."""
    _device_tensors(p, launch, w, bench)
    _work(launch, w)
    if launch.smem_opt_in:
        w.line(
            f"SPATIALC_CHECK(cudaFuncSetAttribute({launch.kernel_name}, cudaFuncAttributeMaxDynamicSharedMemorySize, "
            f"{launch.dyn_smem}));"
        )
    if launch.cooperative:
        _co_resident(launch, w)
    if getattr(launch, "cluster", 1) > 1:
        _clusters_here(launch, w)
    if launch.sync:
        _sync_words(launch, w)
    if launch.tensor_maps:
        _tensor_maps(p, launch, w)


# A map's element type, by its tensor's C type (operands; and the output a TMA store writes): its size is what counts.
TMA_TYPES = {
    "__nv_bfloat16": ("BFLOAT16", 2),
    "__half": ("FLOAT16", 2),
    "signed char": ("UINT8", 1),
    "__nv_fp8_e4m3": ("UINT8", 1),  # the 8-bit floats move as bytes, as int8 does
    "__nv_fp8_e5m2": ("UINT8", 1),
    "float": ("FLOAT32", 4),
    "int": ("INT32", 4),
    "long long": ("INT64", 8),
}


def _tensor_maps(p: SpatialProgram, launch: Launch, w: Writer) -> None:
    """Encode each tensor map of an sm_90a kernel (`Launch.tensor_maps`) over its device buffer, through the driver
    entry point the runtime hands out (no link against libcuda), as `TensorMap.geometry` gives it: 2-D over a
    tensor stored as a matrix."""
    w.line("PFN_cuTensorMapEncodeTiled_v12000 encode_tiled = nullptr;")
    w.line("cudaDriverEntryPointQueryResult found_encode;")
    w.line(
        'SPATIALC_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode_tiled, 12000, '
        "cudaEnableDefault, &found_encode));"
    )
    _exit_if(
        w,
        "found_encode != cudaDriverEntryPointSuccess || !encode_tiled",
        "this driver has no cuTensorMapEncodeTiled, which the sm_90a kernel's tensor maps need (%d)",
        "(int)found_encode",
    )
    for m in launch.tensor_maps:
        t, param = p.tensors[m.tensor], launch.params[m.tensor]
        kind, size = TMA_TYPES[param.c_type]
        dims, strides, box = m.geometry(t.tiles, size)
        rank = len(dims)
        w.line(f"CUtensorMap tmap_{m.index};")
        with w.block():
            w.line(f"const cuuint64_t dims[{rank}] = {{{', '.join(map(str, dims))}}};")
            w.line(f"const cuuint64_t strides[{rank - 1}] = {{{', '.join(map(str, strides))}}};")
            w.line(f"const cuuint32_t box[{rank}] = {{{', '.join(map(str, box))}}};")
            w.line(f"const cuuint32_t unit[{rank}] = {{{', '.join(['1'] * rank)}}};")
            swizzle = f"CU_TENSOR_MAP_SWIZZLE_{m.swizzle}B" if m.swizzle else "CU_TENSOR_MAP_SWIZZLE_NONE"
            w.line(
                f"const CUresult made = encode_tiled(&tmap_{m.index}, CU_TENSOR_MAP_DATA_TYPE_{kind}, "
                f"{rank}, d{int(t.id)}, dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, {swizzle}, "
                "CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);"
            )
            refused = f"cuTensorMapEncodeTiled refused the map of {plain(t.name)} (%d)"
            _exit_if(w, "made != CUDA_SUCCESS", refused, "(int)made")


def _free(p: SpatialProgram, launch: Launch, w: Writer) -> None:
    if launch.sync:
        w.line("SPATIALC_CHECK(cudaFree(d_sync));")
        w.line("SPATIALC_CHECK(cudaFree(d_sync_init));")
    for t in p.tensors:
        w.line(f"SPATIALC_CHECK(cudaFree(d{int(t.id)}));")
    w.line("SPATIALC_CHECK(cudaFree(d_work));")


def program_main(p: SpatialProgram, launch: Launch) -> str:
    """`main` of program_cu: read a.txt, b.txt, … (`operand_files`), launch once, print C row-major a value a line —
    a program of several outputs (LayerNorm's out, mean, rstd) each in turn, in the order of its tensors."""
    outs = [t for t in p.tensors if t.role == TensorRole.OUTPUT]
    assert outs
    w = Writer()
    files = input_files(p)
    read = ", ".join(f"{files[int(t.id)]} ({plain(t.name)})" for t in p.tensors if int(t.id) in files)
    names = ", then ".join(plain(t.name) for t in outs)
    w.line(f"// Reads {read}: one value a line, row-major. Prints the output {names} the same way.")
    with w.block("int main()"):
        _setup(p, launch, w, bench=False)
        _launch(p, launch, w)
        w.line("SPATIALC_CHECK(cudaGetLastError());")
        w.line("SPATIALC_CHECK(cudaDeviceSynchronize());")
        _trip_check(launch, w)
        for out in outs:
            _print_output(p, launch, out, w, "" if len(outs) == 1 else f"_{int(out.id)}")
        _free(p, launch, w)
        w.line("return 0;")
    return w.text()


def _print_output(p: SpatialProgram, launch: Launch, out: Tensor, w: Writer, suffix: str) -> None:
    """Copy output `out` back and print it row-major, a value a line (`suffix` names its host copy)."""
    o = int(out.id)
    # A half or bfloat16 value reaches printf through float: both convert to it exactly, on nvcc's host and g++'s.
    ty = launch.params[p.tensors.index(out)].c_type
    fmt, cast = ("%lld", "long long") if ty in INTEGER_OUTPUTS else ("%.9g", "double)(float")
    y = f"y{suffix}"
    w.line(f"std::vector<{ty}> {y}({_elems(out)});")
    w.line(f"SPATIALC_CHECK(cudaMemcpy({y}.data(), d{o}, {y}.size() * sizeof({ty}), cudaMemcpyDeviceToHost));")
    rows, cols = out.elems
    group = f"(size_t)g * {out.group_tiles[0] * out.tiles[1] * 256} + " if out.groups > 1 else ""
    with contextlib.ExitStack() as loops:
        if out.groups > 1:  # a grouped C: group after group, each on its own grid of tiles
            loops.enter_context(w.block(f"for (int g = 0; g < {out.groups}; ++g)"))
        loops.enter_context(w.block(f"for (int i = 0; i < {rows}; ++i)"))
        loops.enter_context(w.block(f"for (int j = 0; j < {cols}; ++j)"))
        # (a grouped one a group after another, each padded to its tile rows: attention's O)
        row = f"((size_t)g * {out.group_tiles[0] * 16} + i)" if out.groups > 1 else "(size_t)i"
        at = (
            f"{row} * {out.tiles[1] * 16} + j"  # stored as a row-major matrix
            if launch.params[p.tensors.index(out)].order == "rows"
            else f"{group}spatialc_tiled_index(i, j, {out.tiles[1]})"
        )
        w.line(f'printf("{fmt}\\n", ({cast}){y}[{at}]);')


def bench_rate(p: SpatialProgram, launch: Launch) -> tuple[str, str]:
    """What bench_cu reports, and the C expression of what one launch does: a GEMM's `GOPS`, 2·M·N·K operations (a
    grouped GEMM's with every group full); a map program's or a row program's `GBPS`, the bytes of its tensors (the
    logical elements of each input, column vector and the output, at the element types the launch gives them) —
    memory is what bounds it. A map reads and writes each once; a row program reads its input again on each pass
    over a band, and is still credited with one read (the bandwidth it delivers, as softmax and RMSNorm benchmarks
    count it); attention's `GOPS`, its two matmuls over the scores the mask keeps (`attention_ops`)."""
    if attention_stage(p) is not None:
        shape = attention_shape(p)
        q = p.tensor(TensorId(shape.reads[0][0]))
        return "GOPS", f"{attention_ops(shape.op, q.groups, q.elems[1])}.0"
    if is_map_program(p) or is_row_program(p) or is_col_program(p):
        pairs = zip(p.tensors, launch.params, strict=True)
        moved = sum(t.groups * t.elems[0] * t.elems[1] * C_BYTES[q.c_type] for t, q in pairs)
        return "GBPS", f"{moved}.0"
    a, b = [t for t in p.tensors if t.role == TensorRole.INPUT][:2]
    m, kk, n = a.groups * a.elems[0], a.elems[1], b.elems[1]  # a grouped GEMM: every group full
    return "GOPS", f"2.0 * {m}.0 * {n}.0 * {kk}.0"


def attention_ops(op: Attention, heads: int, dim: int) -> int:
    """The operations of one attention (`heads` query heads in all, of `dim`): 4·dim for each score the mask keeps
    (a multiply and an add in Q·Kᵀ and in P·V) — every score, or for a causal one those at or left of each row's
    diagonal, as FlashAttention counts them."""
    if op.causal:
        kept = sum(min(op.seq_kv, r + op.seq_kv - op.seq_q + 1) for r in range(op.seq_q))
    else:
        kept = op.seq_q * op.seq_kv
    return 4 * heads * kept * dim


def bench_main(p: SpatialProgram, launch: Launch) -> str:
    """`main` of bench_cu: fixed inputs, a warm-up launch, 20 timed launches, then `GOPS <value>` (a map program's:
    `GBPS <value>`, `bench_rate`) — only if all ran."""
    unit, per_launch = bench_rate(p, launch)
    w = Writer()
    with w.block("int main()"):
        _setup(p, launch, w, bench=True)
        w.line("cudaEvent_t e0, e1;")
        w.line("SPATIALC_CHECK(cudaEventCreate(&e0));")
        w.line("SPATIALC_CHECK(cudaEventCreate(&e1));")
        _launch(p, launch, w, "  // warm-up")
        w.line("SPATIALC_CHECK(cudaGetLastError());")
        w.line("SPATIALC_CHECK(cudaDeviceSynchronize());")
        w.line(f"const int ITERS = {BENCH_ITERS};")
        w.line("SPATIALC_CHECK(cudaEventRecord(e0));")
        with w.block("for (int it = 0; it < ITERS; ++it)"):
            _launch(p, launch, w)
        w.line("SPATIALC_CHECK(cudaEventRecord(e1));")
        # A failed launch times nothing: checked before any rate is printed, so no rate follows a failure.
        w.line("SPATIALC_CHECK(cudaGetLastError());")
        w.line("SPATIALC_CHECK(cudaEventSynchronize(e1));")
        _trip_check(launch, w)
        w.line("float ms = 0.0f;")
        w.line("SPATIALC_CHECK(cudaEventElapsedTime(&ms, e0, e1));")
        w.line('if (ms <= 0.0f) { fprintf(stderr, "no time measured\\n"); return 1; }')
        w.line(f"const double total = {per_launch} * ITERS;  // {'bytes moved' if unit == 'GBPS' else 'operations'}")
        w.line(f'printf("{unit} %.1f\\n", total / ((double)ms * 1e6));')
        w.line("SPATIALC_CHECK(cudaEventDestroy(e0));")
        w.line("SPATIALC_CHECK(cudaEventDestroy(e1));")
        _free(p, launch, w)
        w.line("return 0;")
    return w.text()


def write_artifact(artifact: CudaArtifact, directory: str | Path) -> list[Path]:
    """Write program.cu, bench.cu, kernel.cu, budget.json, census.json and launch.json into `directory`; the same
    files of the artifact's general form, when it carries one, into `directory`/general."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "program.cu": artifact.program_cu,
        "bench.cu": artifact.bench_cu,
        "kernel.cu": artifact.kernel_cu,
        "budget.json": json.dumps(artifact.budget.to_dict(), indent=2) + "\n",
        "census.json": json.dumps(artifact.census.to_dict(), indent=2) + "\n",
        "launch.json": json.dumps(artifact.launch.to_dict(), indent=2) + "\n",
    }
    written = []
    for name, text in files.items():
        path = out / name
        write_whole(path, text)  # a link planted in the folder is replaced, not written through
        written.append(path)
    if artifact.general is not None:
        written += write_artifact(artifact.general, out / "general")
    return written
