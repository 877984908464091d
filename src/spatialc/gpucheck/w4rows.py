"""The GPU check's W4A16 rows (issue 34 item 8): `w4:FORMAT:MxNxK`, C = A · dequant(B) with A in bf16 and B's 4-bit
weights (FORMAT as `spatialc.gemm(weights=…)` names it: int4 or uint4, a bf16 scale and a zero point per 128 rows
of K; mxfp4, an e8m0 scale per 32) dequantised to bf16 in registers, C stored in bf16. The default rows are the
decode shapes M ∈ {1, 16, 64}, N = K ∈ {4096, 14336}, int4 and mxfp4; uint4 by `--sizes`.

A W4A16 GEMM at these shapes reads its packed weights once and little else: its speed is bandwidth. Its rows count
GB/s of the weights' bytes (packed B, scales, zero points: `weight_bytes`, the row's `ops`) and set each of
spatialc's forms against two baselines measured in the same row:
- torch's bf16 `mm` of A and the weights dequantised beforehand (the dequantisation not timed: what a framework
  without a W4A16 kernel runs, reading 4× the packed bytes), into C allocated beforehand;
- the copy-bandwidth ceiling: the weights' bytes moved by a device-to-device copy (the map rows' copy contestant,
  `maprows.copy_contestant`), the time a kernel that reads the weights once at the copy's bandwidth would take.
The contestants are the forms in W4_FORMS, each built and lowered for its own plan (`form_of`): the general form
(what `auto` prints) and the persistent form. The list is the one place to extend: the sm_90a form's W4A16, once
lower prints it, is one more name in it ("sm90a", compiled for sm_90a on a Hopper, absent elsewhere).

Each kernel is timed kernel only (its arguments uploaded once, the 4-bit ones laid out on the host as the launcher
lays them out, rotated over copies so that the L2 cache does not hold the weights), and its poisoned C is checked
against the float64 reference within `spatialc.tolerance(program, kernel=True)` (w4measure.py measures).

This module holds what the rows need on the CPU — sizes, bytes, the build, the inputs and torch's baseline, which
bench/w4a16_rows.py imports too — and the rows' table (`w4_lines`)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # cases.py imports this module: its names are imported where they are used
    from .cases import Row

PREFIX = "w4"
# Each format's options to spatialc.gemm (the issue's: a scale and a zero point per 128 rows for int4 / uint4).
FORMATS: dict[str, dict[str, Any]] = {
    "int4": {"group": 128, "zeros": True},
    "uint4": {"group": 128, "zeros": True},
    "mxfp4": {},
}
MXFP4_GROUP = 32  # an mxfp4 scale's rows of K (the format's own)
MS = (1, 16, 64)  # decode: a token, a small batch, a larger one
SIDES = (4096, 14336)  # N = K: a 7B-class layer's hidden size and an MLP's width
DEFAULT_FORMATS = ("int4", "mxfp4")
# spatialc's contestants, in the table's order, each lowered in its own form for its own plan (`form_of`); the
# sm_90a form's only on an sm_90a board (elsewhere its contestant is absent, saying why).
W4_FORMS: tuple[str, ...] = ("general", "persistent", "sm90a")
TORCH_MM = "torch mm (dequantised beforehand)"
GOAL = 0.85  # of the ceiling at M = 1 (the bar: bench/README.md, "W4A16 decode rows")
A_RANGE = (-1.0, 1.0)  # A's values, rounded to bf16 by the launcher as by the reference


def default_sizes(formats: tuple[str, ...] = DEFAULT_FORMATS) -> tuple[str, ...]:
    """The rows the check runs by default, format-major, then side, then M (rows that share weights adjoin)."""
    return tuple(f"{PREFIX}:{f}:{m}x{s}x{s}" for f in formats for s in SIDES for m in MS)


def parse_w4(text: str) -> tuple[str, tuple[int, int, int]] | None:
    """`w4:int4:1x4096x4096` → ('int4', (1, 4096, 4096)); None for a size without the prefix."""
    from ..errors import SpatialError
    from .sizes import parse_size

    head, colon, rest = text.partition(":")
    if not colon or head.lower() != PREFIX:
        return None
    fmt, _, dims = rest.partition(":")
    if fmt.lower() not in FORMATS or not dims:
        raise SpatialError(f"size {text!r} is not {PREFIX}:FORMAT:MxNxK with FORMAT one of {', '.join(FORMATS)}")
    return fmt.lower(), parse_size(dims)


def group_of(fmt: str) -> int:
    return int(FORMATS[fmt].get("group", MXFP4_GROUP))


def weight_bytes(fmt: str, n: int, k: int) -> int:
    """The bytes of the weights a row reads once: B packed two values a byte, a scale per group (bf16; mxfp4's e8m0
    one byte) and, where the format has them, a zero point per group (a byte each, as the kernel reads them)."""
    groups = -(-k // group_of(fmt)) * n
    side = groups * (1 if fmt == "mxfp4" else 2 + int(bool(FORMATS[fmt].get("zeros"))))
    return k * n // 2 + side


def gemm_of(case: Any, out: str | None = "bf16") -> Any:
    """The row's W4A16 program (unplanned): bf16 A, its format's weights, C in `out`."""
    import spatialc

    kw: dict[str, Any] = {**FORMATS[case.weights], **({} if out is None else {"out": out})}
    return spatialc.gemm(case.m, case.n, case.k, "bf16", weights=case.weights, **kw)


# ---- the build ---------------------------------------------------------------------------------------------------


def w4_case(built: Any, target: str, out: str | None) -> Any:
    """The row built for `target` (its plan, as auto plans it, in the row's facts) and each form of W4_FORMS
    lowered for its own plan, or absent with lower's line."""
    import spatialc

    from .builds import describe_plan, plan_facts

    gemm = gemm_of(built.case, out)
    program = spatialc.build(gemm, target)
    built.plan = describe_plan(program)
    built.kernel.update(plan_facts(program))
    built.forms = [form_of(gemm, name, target) for name in W4_FORMS]
    return built


def form_of(gemm: Any, name: str, target: str) -> Any:
    """The GEMM built and lowered in form `name` for the architecture its kernels run on (the sm_90a form: sm_90a,
    on a Hopper only), its plan in its facts; absent, with the reason, where the build or lower refuses it."""
    import spatialc

    from .builds import Form, _form, describe_plan, plan_facts
    from .cases import HOPPER_FORM, kernel_arch, one_line

    if name == HOPPER_FORM and target != "sm_90":
        return Form(name, absent=f"the sm_90a form runs on sm_90 (H100 / H200), not {target}")
    arch = kernel_arch(name, target)
    try:
        program = spatialc.build(gemm, arch, form=name)
        artifact = spatialc.lower(program, arch, form=name)
    except Exception as e:
        return Form(name, absent=one_line(e))
    form = _form(name, artifact)
    form.facts.update(plan_facts(program))
    form.facts["w4_plan"] = describe_plan(program)
    return form


def contenders(case: Any, built: Any) -> list[str]:
    """What the dry run says each contestant of a W4A16 row is timed for."""
    mb = weight_bytes(case.weights, case.n, case.k) / 1e6
    said = [
        f"{form.contestant}: {'kernel only, its C checked' if form.artifact else 'n/a (' + form.absent + ')'}"
        for form in built.forms
    ]
    return [
        *said,
        f"{TORCH_MM}: kernel only, bf16 mm on the weights dequantised beforehand (not timed), into C",
        f"ceiling: the weights' {mb:.2f} MB moved by a device-to-device copy (the device's copy bandwidth)",
    ]


# ---- inputs and torch's baseline (bench/w4a16_rows.py imports these) ---------------------------------------------


def inputs(program: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of a W4A16 program by name: its weights (`weights_of`) and A (`activations`)."""
    return {**weights_of(program, seed), "A": activations(program, seed)}


def weights_of(program: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of a W4A16 program by name, the same for every M of one weight shape (seeded by the shape and
    format): B as packed bytes (`pack_int4`'s order; every byte is two codes of the format, so uniform bytes are
    uniform codes), bf16 scales uniform in [0.005, 0.02) (mxfp4's e8m0: 2^-4 … 2^1) and zero points uniform over
    the format's range."""
    from ..inputs import operand_values
    from ..ir.nodes import DType
    from ..numerics.w4 import FOUR_BIT_RANGE

    b, scale = program.tensor_named("B"), program.tensor_named("scale")
    k, n = b.elems
    rng = np.random.default_rng(zlib.crc32(f"w4 {seed} {b.dtype.value} {k}x{n}".encode()))
    out = {"B": rng.integers(0, 256, (k // 2, n), dtype=np.uint8)}
    if scale.dtype == DType.E8M0:
        out["scale"] = 2.0 ** rng.integers(-4, 2, scale.elems)
    else:
        out["scale"] = operand_values("scale", rng.uniform(0.005, 0.02, scale.elems), scale.dtype)
    if any(t.name == "zeros" for t in program.tensors):
        z = program.tensor_named("zeros")
        lo, hi = FOUR_BIT_RANGE[z.dtype]
        out["zeros"] = rng.integers(lo, hi + 1, z.elems).astype(np.int8)
    return out


def activations(program: Any, seed: int = 0) -> np.ndarray:
    """A, uniform in A_RANGE and rounded to bf16 here (float32 holding bf16 values: nothing is rounded on the way
    in, by the launcher or the reference)."""
    from ..inputs import operand_values

    a = program.tensor_named("A")
    m, k = a.elems
    rng = np.random.default_rng(zlib.crc32(f"w4 A {seed} {m}x{k}".encode()))
    return np.asarray(operand_values(a.name, rng.uniform(*A_RANGE, (m, k)), a.dtype), np.float32)


def operands(program: Any, given: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A and the dequantised B as float64 values, exactly as the reference rounds them (A to bf16, B by
    `numerics.w4.dequant`): what torch's baseline multiplies (both hold bf16 values exactly)."""
    from ..numerics.reference import rounded_operands

    return rounded_operands(program, given)


def a_values(program: Any, given: dict[str, Any]) -> np.ndarray:
    """A's float64 values alone, rounded as `operands` rounds them (the weights' need not be made again)."""
    from ..inputs import operand_values

    a = program.tensor_named("A")
    return np.asarray(operand_values(a.name, given[a.name], a.dtype), np.float64)


def torch_mm(torch: Any, a: Any, weights: list[Any], c: Any) -> Callable[[int], None]:
    """torch's baseline over rotated copies of the dequantised weights: `mm(A, W_i)` in bf16 into C."""

    def kernel(i: int) -> None:
        torch.mm(a, weights[i], out=c)

    return kernel


# ---- the table ---------------------------------------------------------------------------------------------------

W4_COLUMNS: tuple[str, ...] = ("weights", "m×n×k", "MB", "contestant", "kernel µs", "GB/s of the weights")
W4_COLUMNS += ("of ceiling", "torch / it", "max err", "correct", "status")


def _kernel_s(row: Row, name: str) -> float | None:
    """A contestant's kernel time, where its result was right (a wrong kernel's speed says nothing)."""
    c = next((c for c in row.contestants if c.name == name), None)
    return c.kernel.median_s if c is not None and c.ok and c.kernel is not None else None


def _ceiling_s(row: Row) -> float | None:
    from .rates import best

    ref = best(row, "copy", "kernel")
    return ref.kernel.median_s if ref is not None and ref.kernel is not None else None


def w4_summary(row: Row) -> dict[str, Any]:
    """A W4A16 row's numbers for the JSON report: each contestant's kernel time, its GB/s of the weights, its share
    of the copy ceiling and torch's time over its own (None where it has no right, timed kernel)."""
    ceiling, torch = _ceiling_s(row), _kernel_s(row, TORCH_MM)
    each = {}
    for c in row.contestants:
        t = _kernel_s(row, c.name)
        each[c.name] = {
            "kernel_s": t,
            "gb_s": row.ops / t / 1e9 if t else None,
            "of_ceiling": ceiling / t if t and ceiling else None,
            "torch_over": torch / t if t and torch else None,
        }
    return {"weight_bytes": row.ops, "ceiling_s": ceiling, "contestants": each}


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def w4_cells(row: Row) -> list[list[str]]:
    """The table's lines of one W4A16 row: a line per contestant, the ceiling's last."""
    from .rates import _cell, _correct, _err, _rate, size_cell

    summary = w4_summary(row)["contestants"]
    status = row.status + (f": {row.note}" if row.note else "")
    lines = []
    for c in row.contestants:
        s = summary[c.name]
        t = s["kernel_s"]
        time = f"{t * 1e6:.1f}" if t else (c.note or "—")
        mine = c.family == "spatialc"
        cells = [row.weights, size_cell(row).removeprefix(f"{PREFIX}:{row.weights}:"), _rate(row.ops / 1e6), c.name]
        cells += [time, _rate(s["gb_s"]), _ratio(s["of_ceiling"]), _ratio(s["torch_over"])]
        cells += [_err(c.check) if mine else "—", _correct(c) if mine else ("right" if c.ok else "—")]
        lines.append([_cell(x) for x in [*cells, status if mine else ""]])
    return lines


def w4_lines(rows: list[Row]) -> list[str]:
    """The W4A16 rows' table (none without such rows)."""
    w4 = [r for r in rows if r.weights]
    if not w4:
        return []
    out = [
        "",
        "W4A16 (bf16 A, 4-bit weights dequantised in the kernel, bf16 C; kernel only; GB/s of the weights' "
        "bytes — packed B, scales, zero points — each read once; of ceiling: the time a device-to-device copy takes "
        "to move those bytes (the device's copy bandwidth) over the contestant's, 1.00 at the bandwidth bound, the "
        f"issue's goal {GOAL:.2f} at M = 1; torch / it: torch's bf16 mm on the weights dequantised beforehand (not "
        "timed) over the contestant's time, above 1 faster than torch; correct: C within spatialc.tolerance's bound "
        "of its float64 reference, every element):",
        "",
        "| " + " | ".join(W4_COLUMNS) + " |",
        "|" + "---|" * len(W4_COLUMNS),
    ]
    for r in w4:
        out += ["| " + " | ".join(cells) + " |" for cells in w4_cells(r)]
    return out
