"""The commands of `spatialc`, one function each: gemm, show, verify, lower, run."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .. import api
from ..errors import DeadlockError, SpatialError
from ..files import read_at_most, write_whole
from ..ir.nodes import SpatialProgram
from ..ir.ops import BARE_GELU_NOTE, FP8_PRECISIONS
from ..ir.printer import plural, program_text
from ..ir.serde import MAX_DOCUMENT_BYTES, to_json
from ..numerics.tolerance import tolerance
from ..passes.multicast import MulticastWarning
from ..target import target
from .check import CheckPlan, plan_check, sample_text
from .parser import UsageError
from .report import kernel_lines, program_lines, random_inputs


def epilogue_of(args: argparse.Namespace) -> list:
    """The epilogue the flags ask for, in the fixed order row scale → column scale → bias → relu → activations →
    scalars → residual → gate → requant."""
    from .. import frontend

    stages: list = [frontend.row_scale()] if getattr(args, "row_scale", False) else []
    stages += [frontend.col_scale()] if getattr(args, "col_scale", False) else []
    stages += [frontend.bias()] if args.bias else []
    stages += [frontend.relu()] if args.relu else []
    if "gelu" in args.activation:  # still the tanh form, as it always was; said once, as the API's FutureWarning
        print(f"note: {BARE_GELU_NOTE}", file=sys.stderr)
    stages += [frontend.activation("gelu_tanh" if name == "gelu" else name) for name in args.activation]
    stages += [frontend.scalar(op, value) for op, value in args.scalar]
    stages += [frontend.residual()] if getattr(args, "residual", False) else []
    stages += [frontend.gate()] if getattr(args, "gate", False) else []
    stages += [frontend.requant(*args.requant)] if args.requant else []
    return stages


def cmd_gemm(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check a GEMM; lower, emit and run its kernel as asked."""
    from ..frontend import stage_name

    stages = epilogue_of(args)
    w4 = {"weights": args.weights, "group": args.group, "zeros": args.zeros, "scale_type": args.scale_type}
    scales = getattr(args, "scales", None)  # (a command that shares these options may not take --scales)
    prog = api.gemm(args.m, args.n, args.k, args.precision, epilogue=stages, out=args.out, scales=scales, **w4)
    epi = " → ".join(stage_name(s) for s in stages)
    head = f"spatialc gemm {args.m}x{args.n}x{args.k} {args.precision}"
    if args.weights:
        head += f", {args.weights} weights" + (" with zero points" if args.zeros else "")
    head += f", scales {scales_text(scales)}" if scales else ""
    p, inputs, times, plan = _built(
        args, prog, head, f", epilogue {epi}" if epi else "", split_k=args.split_k, multicast=args.multicast
    )
    return _check_and_run(p, args, inputs, times, plan)


def cmd_grouped_gemm(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check a grouped GEMM on random operands and the given (or random) row counts."""
    scales = args.scales
    prog = api.grouped_gemm(
        args.groups,
        args.max_rows,
        args.n,
        args.k,
        args.precision,
        epilogue=epilogue_of(args),
        out=args.out,
        scales=scales,
    )
    head = f"spatialc grouped-gemm {args.groups} groups of at most {args.max_rows}x{args.n}x{args.k} {args.precision}"
    head += f", scales {scales_text(scales)}" if scales else ""
    p, inputs, times, plan = _built(args, prog, head, "")
    if args.sizes is not None:
        if len(args.sizes) != args.groups:
            raise UsageError(f"--sizes gives {len(args.sizes)} row counts for {args.groups} groups")
        inputs["sizes"] = np.array(args.sizes, dtype=np.int64)
    shown = ", ".join(map(str, inputs["sizes"][:16])) + (", …" if args.groups > 16 else "")
    print(f"  sizes     {shown} ({int(np.sum(inputs['sizes']))} rows in all, of {args.groups * args.max_rows})")
    return _check_and_run(p, args, inputs, times, plan)


def cmd_elementwise(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check an elementwise program; lower, emit and run its kernel as asked."""
    from .. import ew

    expr, names = ew.parse_outputs(args.expr, args.inputs)
    prog = api.elementwise(expr, args.m, args.n, args.precision, names=names, out=args.out)
    head = f"spatialc elementwise {args.expr!r} over {args.m}x{args.n} {args.precision}"
    return _paged(args, prog, head, f", inputs {', '.join(names)}")


def cmd_softmax(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check a softmax of each row."""
    prog = api.softmax(args.m, args.n, args.precision, out=args.out, online=args.online)
    online = ", online" if args.online else ""
    return _paged(args, prog, f"spatialc softmax over {args.m}x{args.n} {args.precision}{online}")


def cmd_log_softmax(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check a log-softmax of each row."""
    prog = api.log_softmax(args.m, args.n, args.precision, out=args.out, online=args.online)
    online = ", online" if args.online else ""
    return _paged(args, prog, f"spatialc log-softmax over {args.m}x{args.n} {args.precision}{online}")


def cmd_rmsnorm(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check an RMS norm of each row (with --residual, fused add + RMSNorm: its two
    outputs, out and residual_out)."""
    prog = api.rmsnorm(
        args.m, args.n, args.precision, eps=args.eps, weight=not args.no_weight, residual=args.residual, out=args.out
    )
    fused = ", fused add (residual)" if args.residual else ""
    return _paged(args, prog, f"spatialc rmsnorm over {args.m}x{args.n} {args.precision}, eps {args.eps:g}{fused}")


def cmd_row_reduce(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check one reduction of each row into an M×1 output."""
    prog = api.row_reduce(args.m, args.n, args.op, args.precision, out=args.out)
    return _paged(args, prog, f"spatialc row-reduce {args.op} over {args.m}x{args.n} {args.precision}")


def cmd_col_reduce(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check one reduction of each column into a 1×N output."""
    prog = api.col_reduce(args.m, args.n, args.op, args.precision, out=args.out)
    return _paged(args, prog, f"spatialc col-reduce {args.op} over {args.m}x{args.n} {args.precision}")


def cmd_layernorm(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check a layer norm of each row, its three outputs (out, mean, rstd)."""
    prog = api.layernorm(
        args.m,
        args.n,
        args.precision,
        eps=args.eps,
        weight=not args.no_weight,
        bias=not args.no_bias,
        out=args.out,
    )
    return _paged(args, prog, f"spatialc layernorm over {args.m}x{args.n} {args.precision}, eps {args.eps:g}")


def cmd_attention(args: argparse.Namespace) -> int:
    """Build, verify, evaluate and check an attention, its two outputs (o, lse)."""
    prog = api.attention(
        args.batch,
        args.heads,
        args.seq_q,
        args.seq_kv,
        args.head_dim,
        kv_heads=args.kv_heads,
        causal=args.causal,
        scale=args.scale,
        precision=args.precision,
        out=args.out,
    )
    kv = f", {args.kv_heads} KV heads" if args.kv_heads is not None else ""
    shape = f"{args.batch}x{args.heads}x{args.seq_q}x{args.seq_kv}x{args.head_dim}"
    causal = ", causal" if args.causal else ""
    return _paged(args, prog, f"spatialc attention {shape} {args.precision}{causal}{kv}")


def _paged(args: argparse.Namespace, prog: SpatialProgram, head: str, tail: str = "") -> int:
    """A program without a tile matmul of its own (`options.page_options`): its block of ROWS x COLS tiles is the plan's
    (ROWS, COLS, 1)."""
    args.block = None if args.block is None else (*args.block, 1)
    p, inputs, times, plan = _built(args, prog, head, tail)
    return _check_and_run(p, args, inputs, times, plan)


def _built(
    args: argparse.Namespace, prog: SpatialProgram, head: str, tail: str, **extra
) -> tuple[SpatialProgram, dict, list[str], CheckPlan]:
    """`prog` built as the options say, its plan printed (and saved with --json); the random inputs it runs on, and
    how much of it is checked."""
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", MulticastWarning)
        p = api.build(
            prog,
            args.target,
            block=args.block,
            sub_blocks=args.sub_blocks,
            depth=args.depth,
            sites=args.sites,
            placement=args.placement,
            form=args.form,
            **extra,
        )
    t_build = time.perf_counter() - t0
    tgt = target(p.target)
    print(f"{head} on {tgt.name} ({tgt.board}){tail}")
    print("\n".join(program_lines(p)))
    for w in said:  # a multicast plan that reads no less than the plan without groups is a note; the rest as they were
        if issubclass(w.category, MulticastWarning):
            print(f"  note      {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)  # as --emit and --pictures make their folders
        write_whole(args.json, to_json(p, indent=1))
        print(f"  saved     {args.json}")
    plan = plan_check(p, args.check, args.seed, full_inputs=args.run)  # refused now, before the inputs are made
    if args.run:
        _refuse_emulation_first(p, args)
    # A kernel runs on whole inputs; a sample's are just its rows; with no check and no run, no operand is made.
    inputs = random_inputs(p, args.seed, None if args.run else plan.sample, args.run or plan.mode != "none")
    return p, inputs, [f"build {t_build * 1e3:.0f} ms"], plan


def _refuse_emulation_first(p: SpatialProgram, args: argparse.Namespace) -> None:
    """A run the emulation would refuse (`check_emulable`: its memory, its threads), refused from the kernel alone
    before any input is made: at an LLM's size the inputs take minutes and gigabytes before the emulation says no.
    A GPU runs the kernel instead; a program no CUDA form prints is said so by the kernel line, as at any size."""
    from ..runtime.emulate import check_emulable
    from ..runtime.launch import GpuUnavailable, cupy_device

    try:
        cupy_device()
        return
    except GpuUnavailable:
        pass
    t0 = time.perf_counter()
    try:
        art = _lowered(p, args)
    except SpatialError:
        return
    args.lowered = (p, art, time.perf_counter() - t0)  # the kernel `_kernel` prints and runs: lowered once
    check_emulable(art)


def _lowered(p: SpatialProgram, args: argparse.Namespace):
    """`p` lowered as the command asks (its form; attention's KV-loop schedule where asked for), or the artifact
    `_refuse_emulation_first` already lowered for it."""
    kept = getattr(args, "lowered", None)
    if kept is not None and kept[0] is p:
        return kept[1]
    schedule = getattr(args, "schedule", None)
    return api.lower(p, form=args.form, **({"schedule": schedule} if schedule else {}))


def _lowering_time(p: SpatialProgram, args: argparse.Namespace, since: float) -> float:
    """Seconds `p`'s lowering took: since `since`, plus what `_refuse_emulation_first` spent lowering it first."""
    kept = getattr(args, "lowered", None)
    return time.perf_counter() - since + (kept[2] if kept is not None and kept[0] is p else 0.0)


def _check_and_run(p: SpatialProgram, args: argparse.Namespace, inputs: dict, times: list[str], plan: CheckPlan) -> int:
    """The interpreter against numpy (all of C, a sample of its rows, or neither), then (as asked) the kernel:
    printed, emitted, run."""
    pictures = _pictures_asked(p, args)
    given = _sampled(inputs, plan)
    c = _interpreted(p, given, plan, pictures, times) if plan.mode != "none" else None
    if c is None:
        ok = True
        if pictures:
            _pictures(p, None, pictures)
            print("  picture   no timeline.svg: it draws the interpreter's run, and --check none runs none")
        why = plan.why or "--check none"
        print(f"  check     none ({why}): the interpreter did not run, and nothing was compared with numpy")
        times.append("check none")
    else:
        t0 = time.perf_counter()
        ok, how = tolerance(p).check(c, given, rows=plan.rows)
        times.append(f"check {(time.perf_counter() - t0) * 1e3:.0f} ms")
        what = f" on rows {sample_text(plan)} of C (--check sampled{plan.why})" if plan.sample else ""
        print(f"  check     interpreter vs numpy reference{what}: {'OK' if ok else 'MISMATCH'}, {how}")
    if getattr(args, "show", False):
        print(program_text(p, sites=2), end="")
    status = 0 if ok else 1
    status = max(status, _kernel(p, args, inputs, (c, given, plan), times))
    print(f"  time      {', '.join(times)}")
    return status


def _interpreted(p: SpatialProgram, given: dict, plan: CheckPlan, pictures: Pictures | None, times: list[str]):
    """C (or its sampled rows) from the reference interpreter, its run drawn into `pictures` where asked."""
    t0 = time.perf_counter()
    rows = {"rows": plan.rows} if plan.sample is not None else {}
    if pictures:
        c, trace = api.evaluate(p, given, trace=True, **rows)
    else:
        c = api.evaluate(p, given, **rows)
    times.append(f"evaluate {(time.perf_counter() - t0) * 1e3:.0f} ms")
    if pictures:
        _pictures(p, trace, pictures)
    return c


def _sampled(inputs: dict, plan: CheckPlan) -> dict:
    """The inputs as a sampled check takes them: its tensors (A) as just the sampled rows (in each group)."""
    if plan.sample is None:
        return inputs
    rows = list(plan.sample.rows)
    out = dict(inputs)
    for name in plan.sample.given:
        a = inputs[name]
        if a.shape[-2] != len(rows) or len(rows) == 0:
            out[name] = a[rows] if a.ndim == 2 else a[:, rows]
    return out


def _kernel(p: SpatialProgram, args: argparse.Namespace, inputs: dict, checked: tuple, times: list[str]) -> int:
    """The kernel's memory; with --emit its files, with --run its result against the interpreter's (`checked`: C or
    its sampled rows, the inputs they came from and the check's plan)."""
    t0 = time.perf_counter()
    schedule = getattr(args, "schedule", None)  # (attention's KV loop: asked for, it must be printed)
    try:
        art = _lowered(p, args)
    except SpatialError as e:
        # A forced form or schedule that cannot be printed fails alike; an 8-bit float program no form prints for
        # this target (sm_80, sm_86) runs in the interpreter
        interpreted = p.precision in FP8_PRECISIONS and not args.emit and args.form == "auto"
        sass = getattr(args, "sass", False)
        if args.emit or (args.run and not interpreted) or args.form != "auto" or sass or schedule:
            raise
        print(f"  kernel    none: {e}")
        if args.run:
            print(f"  run       the interpreter's, checked above: no CUDA form multiplies 8-bit floats on {p.target}")
        return 0
    times.append(f"lower {_lowering_time(p, args, t0) * 1e3:.0f} ms")
    if args.emit or getattr(args, "sass", False):  # --sass compiles the kernel anyway: ptxas's count comes with it
        art = _ptxas(art, times, general=bool(args.emit))  # the general form's only where --emit writes it
    print("\n".join(kernel_lines(p, art)))
    _sass(p, art, args)
    if args.emit:
        from ..lower.cuda.common.host import write_artifact

        names = ", ".join(sorted(str(f.relative_to(args.emit)) for f in write_artifact(art, args.emit)))
        print(f"  emitted   {args.emit}/: {names}")
    if not args.run:
        return 0
    t0 = time.perf_counter()
    where, out = _run_somewhere(art, inputs, args.mode or "late", args.progress, getattr(args, "timeout", None))
    times.append(f"run {(time.perf_counter() - t0) * 1e3:.0f} ms")
    return _kernel_checked(p, where, out, *checked)


def _kernel_checked(p: SpatialProgram, where: str, out: np.ndarray, c, given: dict, plan: CheckPlan) -> int:
    """The kernel's C against the interpreter's (int8, exactly) or the reference (within the float32-sum bound)."""
    if c is None:
        print(f"  run       {where}: C not checked (--check none)")
        return 0
    if plan.rows is not None:
        out = out[list(plan.rows)] if out.ndim == 2 else out[:, list(plan.rows)]
    if p.precision.value == "int8":
        same, how = _exactly(out, c), "the reference interpreter, exactly"
    else:
        same, how = tolerance(p, kernel=True).check(out, given, rows=plan.rows)
        how = f"the numpy reference within its bound: {how}"
    rows = f" (rows {sample_text(plan)})" if plan.rows is not None else ""
    print(f"  run       {where}: C{rows} {'equals' if same else 'DIFFERS FROM'} {how}")
    return 0 if same else 1


def _exactly(out: Any, c: Any) -> bool:
    """Whether the kernel's output is the interpreter's bit for bit: each output's, by name, of a program of
    several (a dict, as `evaluate` and the kernel give them)."""
    if isinstance(out, dict) or isinstance(c, dict):
        return (
            isinstance(out, dict)
            and isinstance(c, dict)
            and out.keys() == c.keys()
            and all(_exactly(out[k], c[k]) for k in c)
        )
    return bool(np.array_equal(out, c))


def _run_somewhere(art, inputs: dict, mode: str, progress: bool, timeout: float | None = None) -> tuple[str, Any]:
    """Run on the GPU when CuPy finds one, else through the host emulation; say which (and why not the GPU)."""
    from ..runtime.launch import GpuUnavailable, cupy_device

    try:
        dev = cupy_device()
    except GpuUnavailable as e:
        return f"under the host emulation ({mode} copies; {e})", _emulate(art, inputs, mode, progress, timeout)
    cp = dev.cp
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    # Every tensor by its name: a GEMM's A and B, an MLP's X, W1, W2, a map's x0, x1, …, and the parameters.
    out = api.run(art, **inputs)  # several outputs (LayerNorm's): a dict by name, checked as the emulation's is
    if isinstance(out, dict):
        return f"on the GPU ({name})", {k: np.asarray(v) for k, v in out.items()}
    return f"on the GPU ({name})", np.asarray(out)


def _emulate(art, inputs: dict, mode: str, progress: bool, timeout: float | None = None) -> np.ndarray:
    """The emulated run, reporting its progress on stderr when that is a terminal (or when asked)."""
    from ..runtime.emulate import stderr_progress

    with stderr_progress("emulating", force=progress) as report:  # a failed run's error starts on its own line
        return api.emulate(art, inputs, mode=mode, progress=report, timeout=timeout)


Pictures = tuple[Path, int, tuple[int, int] | None]  # --pictures DIR, --pictures-site, --pictures-window


def _pictures_asked(p: SpatialProgram, args: argparse.Namespace) -> Pictures | None:
    """Where the pictures go and which site and ticks the timeline draws; a site the program lacks is refused
    here, before a long run is traced for it."""
    if not getattr(args, "pictures", None):
        return None
    from ..viz import check_site

    site = args.pictures_site or 0
    check_site(p, site)
    return args.pictures, site, args.pictures_window


def _pictures(p: SpatialProgram, trace, asked: Pictures) -> None:
    from ..viz import write_pictures

    folder, site, window = asked
    for path in write_pictures(folder, p, trace, site=site, window=window):
        print(f"  picture   {path}")


def _read_program(path: Path) -> SpatialProgram:
    try:
        data = read_at_most(path, MAX_DOCUMENT_BYTES)
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    if data is None:
        raise UsageError(f"{path} is over {MAX_DOCUMENT_BYTES >> 20} MiB, more than any spatialc program takes")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not a text file, so not a spatialc program") from None
    return api.from_json(text)


def _verified(path: Path, pictures: Path | None = None) -> SpatialProgram:
    """The saved program, verified here whatever its document claims (a deadlock drawn into `pictures`)."""
    from ..passes.verify import verify

    p = _read_program(path)
    try:
        return verify(p.evolve())
    except DeadlockError as e:
        if pictures:
            from ..viz import write_deadlock

            drawn = write_deadlock(pictures, p, e)
            raise UsageError(f"{e} (wait-for graph: {drawn})") from None
        raise


def cmd_show(args: argparse.Namespace) -> int:
    """Print a saved program (with --python, as the embedded language's source, of a program verified first: the
    printer reads a well-formed one; the listing shows any program that reads, verified or not)."""
    if getattr(args, "python", False):
        from ..lang.source import python_source

        print(python_source(_verified(args.file)), end="")
        return 0
    program = _read_program(args.file)
    print(program_text(program, sites=args.sites), end="")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Verify a saved program and say which lowering takes it, or why none does."""
    p = _verified(args.file, args.pictures)
    if p.schedule is None:  # rules 3-8 hold of no engine program: say what was proved, and no more
        placed = ", every item placed once" if p.placement is not None and p.plan is not None else ""
        print(
            f"{p.name}: verified as far as a program without a schedule goes — well-formed{placed}; it has no"
            " engine programs, so nothing is proved of rings, bounds, deadlock or what it computes"
            " (spatialc.build schedules it)"
        )
    else:
        print(
            f"{p.name}: verified — well-formed, every item placed once, rings owned, balanced and deep enough, every"
            " access in bounds, deadlock-free, and it computes what its stages declare"
        )
    print(f"  lowering  {_lowering(p, args.file)}")
    if args.pictures:
        print(f"  pictures  none drawn: {args.pictures} would get the wait-for graph of a deadlock, and there is none")
    return 0


def _lowering(p: SpatialProgram, path: Path) -> str:
    """Which lowering takes `p`, in plain words."""
    try:
        art = api.lower(p)
    except SpatialError as e:
        return f"none yet: {e}"
    bud = art.budget
    kind = {"persistent": "persistent CUDA kernel", "sm90a": "sm_90a CUDA form (TMA, wgmma)"}.get(
        bud.form, "general CUDA form"
    )
    why = "".join(f"; {note}" for note in art.notes if note.startswith("the general form, as"))
    return (
        f"the {kind} for {art.target} takes it: {plural(art.launch.grid, 'block')} of"
        f" {bud.threads} threads,"
        f" {bud.total_bytes} bytes of shared memory a block (`spatialc lower {path} --emit DIR` writes it){why}"
    )


def _ptxas(art, times: list[str], *, general: bool = True):
    """The artifact with ptxas's register counts in its budget (and, with `general`, its general form's), where nvcc
    is here to compile its kernels."""
    from ..runtime.nvcc import find_nvcc, with_ptxas

    if find_nvcc() is None:
        return art
    t0 = time.perf_counter()
    art = with_ptxas(art, general=general)
    took = time.perf_counter() - t0
    times.append(f"nvcc {took:.1f} s" + (" (cached)" if took < 0.05 else ""))  # no compile runs in 50 ms
    return art


def _sass(p: SpatialProgram, art, args: argparse.Namespace) -> None:
    """With --sass: one line on the main loop of the kernel as nvcc compiles it here (runtime/sass.py)."""
    if not getattr(args, "sass", False):
        return
    from ..runtime.nvcc import find_nvcc
    from ..runtime.sass import SassError, find_cuobjdump, main_loop_summary

    if find_nvcc() is None or find_cuobjdump() is None:
        raise SassError(
            "--sass needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm);"
            f" found nvcc: {find_nvcc() is not None}, cuobjdump: {find_cuobjdump() is not None}"
        )
    plan, bud = p.plan, art.budget
    warps = dict(bud.engines).get("compute", bud.threads // 32)
    # The busiest warp's tile-MACs in one K step: an item's tiles shared out over the compute warps, the first ones
    # taking one more where they do not divide (a 1 × 1 block: one warp multiplies, the others wait).
    step = -(-plan.item_tiles[0] * plan.item_tiles[1] // warps) * plan.block.ibw if plan else None
    print(f"  sass      {main_loop_summary(art, step)}")


def cmd_lower(args: argparse.Namespace) -> int:
    """Lower a saved program and write its kernel's files."""
    from ..lower.cuda.common.host import write_artifact

    p = _verified(args.file)
    art = _ptxas(api.lower(p, form=args.form), [])
    print(f"{p.name}: lowered for {art.target} in {art.budget.form} form")
    print("\n".join(kernel_lines(p, art)))
    _sass(p, art, args)
    for f in sorted(write_artifact(art, args.emit)):
        print(f"  wrote     {f}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run a saved program on random inputs: the interpreter against numpy, then its kernel against the interpreter."""
    p = _verified(args.file)
    print(f"spatialc run {args.file}: {p.name} on {p.target}")
    print("\n".join(program_lines(p)))
    plan = plan_check(p, getattr(args, "check", None), args.seed, full_inputs=True)
    args.run = True  # a saved program's kernel always runs
    _refuse_emulation_first(p, args)
    print(f"  inputs    random, seed {args.seed}", file=sys.stdout)
    return _check_and_run(p, args, random_inputs(p, args.seed), [], plan)


def scales_text(scales: tuple[str, str] | str) -> str:
    """--scales as the header says it: A's and B's layouts, or mx."""
    return scales if isinstance(scales, str) else ",".join(scales)
