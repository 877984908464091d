"""The GPU check's table: rows of measurements in, rates, % of cuBLAS, JSON and Markdown out. No GPU needed."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

UNIT = {"int8": "TOP/s", "fp16": "TFLOP/s", "bf16": "TFLOP/s"}
TOLERANCE = {
    "int8": "int8: exact (integer result equal to the float64 reference)",
    "fp16": "fp16/bf16: ‖C−R‖_F/‖R‖_F ≤ 1e-4 and max|C−R| ≤ 1e-3·max|R| (operands are exact; only the fp32 "
    "accumulation rounds)",
}
REL_FRO_TOL = 1e-4
MAX_ABS_TOL = 1e-3  # × max|R|


@dataclass
class Check:
    """How one kernel's output compared with the float64 reference."""

    correct: bool
    max_abs: float
    rel_fro: float
    unwritten: int  # logical elements still holding the poison
    pad_unwritten: int  # padding elements still holding the poison (the kernel writes whole tiles)
    nonfinite: int
    stable: bool | None = None  # a second poisoned run on the same inputs agreed


@dataclass
class Baseline:
    """One library's time for the same product (None: not run, `note` says why)."""

    name: str
    family: str  # "cublas" or "triton"
    median_s: float | None = None
    max_abs: float | None = None
    ok: bool | None = None  # its own result agreed with the reference
    note: str = ""


@dataclass
class Row:
    """One (precision, m, n, k) of the check."""

    precision: str
    m: int
    n: int
    k: int
    status: str = "pending"  # ok | wrong | error | hung | skipped | pending (not reached yet)
    plan: str = ""
    launch: str = ""
    median_s: float | None = None
    reps: int = 0
    check: Check | None = None
    baselines: list[Baseline] = field(default_factory=list)
    note: str = ""
    # The kernel's numbers: plan (block, sub_blocks, depth, sites), budget (threads, blocks_per_sm, dyn_smem,
    # regs_est) and, once nvcc compiled it, ptxas's (registers, spill_stores, spill_loads, static_smem, stack);
    # `ptxas` says why those are missing.
    kernel: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def ops(self) -> int:
        return 2 * self.m * self.n * self.k


def rate(ops: int, seconds: float | None) -> float | None:
    """Tera-operations per second."""
    if seconds is None or seconds <= 0:
        return None
    return ops / seconds / 1e12


def best(row: Row, family: str) -> Baseline | None:
    """The fastest baseline of `family` that ran and whose own result was right."""
    timed = [b for b in row.baselines if b.family == family and b.median_s and b.ok is not False]
    return min(timed, key=lambda b: b.median_s or math.inf, default=None)


def percent_of(row: Row, family: str) -> float | None:
    """spatialc's speed as a percentage of the fastest `family` baseline."""
    ref = best(row, family)
    if ref is None or not row.median_s or not ref.median_s:
        return None
    return 100.0 * ref.median_s / row.median_s


def row_dict(row: Row) -> dict[str, Any]:
    """A row with its derived rates, for the JSON report."""
    d = asdict(row)
    d["size"] = row.size
    d["unit"] = UNIT.get(row.precision, "TOP/s")
    d["spatialc_rate"] = rate(row.ops, row.median_s)
    for family in ("cublas", "triton"):
        ref = best(row, family)
        d[f"{family}_best"] = None if ref is None else {"name": ref.name, "rate": rate(row.ops, ref.median_s)}
        d[f"pct_of_{family}"] = percent_of(row, family)
    return d


def _clean(x: Any) -> Any:
    """JSON without NaN / Infinity (which strict readers refuse)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def to_json(header: dict[str, Any], rows: list[Row]) -> str:
    """The whole report as JSON."""
    return json.dumps(_clean({"header": header, "rows": [row_dict(r) for r in rows]}), indent=2, ensure_ascii=False)


COLUMNS = (
    "precision",
    "m×n×k",
    "plan",
    "spatialc",
    "cuBLAS (fastest)",
    "% cuBLAS",
    "Triton",
    "% Triton",
    "max err",
    "correct",
    "status",
)


def _rate(x: float | None) -> str:
    """A rate with one decimal, or three significant digits when it is small (a tiny product)."""
    if x is None:
        return "—"
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}%"


def _err(c: Check | None) -> str:
    if c is None:
        return "—"
    return f"{c.max_abs:.3g}" if math.isfinite(c.max_abs) else str(c.max_abs)


def _correct(row: Row) -> str:
    if row.check is None:
        return "—"
    if not row.check.correct:
        return "no"
    return "yes" if row.check.stable is not False else "no (unstable)"


def table_cells(row: Row) -> list[str]:
    """One Markdown table line's cells."""
    unit = UNIT.get(row.precision, "TOP/s")
    cub, tri = best(row, "cublas"), best(row, "triton")
    cub_text = "—" if cub is None else f"{_rate(rate(row.ops, cub.median_s))} ({cub.name})"
    tri_text = "—" if tri is None else _rate(rate(row.ops, tri.median_s))
    status = row.status + (f": {row.note}" if row.note else "")
    spatialc = _rate(rate(row.ops, row.median_s))
    return [
        row.precision,
        row.size.replace("x", "×"),
        row.plan or "—",
        f"{spatialc} {unit}",
        cub_text,
        _pct(percent_of(row, "cublas")),
        tri_text,
        _pct(percent_of(row, "triton")),
        _err(row.check),
        _correct(row),
        status.replace("|", "/"),
    ]


def to_markdown(header: dict[str, Any], rows: list[Row]) -> str:
    """The report as Markdown: a header list, the table, then notes on the baselines that did not run."""
    lines = ["# spatialc GPU check", ""]
    for key in ("date", "state", "gpu", "sms", "clocks", "commit", "target", "budget_s", "elapsed_s", "versions"):
        if key in header:
            lines.append(f"- {key}: {header[key]}")
    lines += [f"- tolerance: {TOLERANCE['int8']}; {TOLERANCE['fp16']}", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_cells(r)) + " |" for r in rows]
    notes = [f"- {r.precision} {r.size} {b.name}: {b.note}" for r in rows for b in r.baselines if b.note]
    if notes:
        lines += ["", "Baselines:", *notes]
    lines += kernel_table(rows)
    return "\n".join(lines) + "\n"


KERNEL_COLUMNS = (
    "precision",
    "m×n×k",
    "block",
    "sub",
    "depth",
    "sites",
    "threads",
    "blocks/SM",
    "dyn smem",
    "regs (est)",
    "spill st/ld",
    "static smem",
)
REGS_PER_SM = 65536  # the register file of one SM (sm_80 … sm_90)


def _get(kernel: dict[str, Any], key: str) -> str:
    value = kernel.get(key)
    return "—" if value is None else str(value)


def kernel_cells(row: Row) -> list[str]:
    """One line of the kernel table: the plan, the budget and what ptxas said (bytes)."""
    k = row.kernel
    if "registers" in k:
        regs = f"{k['registers']} ({_get(k, 'regs_est')})"
        spills = f"{k['spill_stores']}/{k['spill_loads']}" + (" ⚠" if spilled(k) else "")
        static = str(k["static_smem"])
    else:
        why = str(k.get("ptxas", "")).replace("|", "/")
        regs, spills, static = f"— ({_get(k, 'regs_est')})", why or "—", "—"
    return [
        row.precision,
        row.size.replace("x", "×"),
        _get(k, "block"),
        _get(k, "sub_blocks"),
        _get(k, "depth"),
        _get(k, "sites"),
        _get(k, "threads"),
        _get(k, "blocks_per_sm"),
        _get(k, "dyn_smem"),
        regs,
        spills,
        static,
    ]


def spilled(kernel: dict[str, Any]) -> bool:
    return bool(kernel.get("spill_stores") or kernel.get("spill_loads"))


def register_blocks(kernel: dict[str, Any]) -> int | None:
    """Blocks per SM the register file allows at ptxas's count (allocated in steps of 8 per thread)."""
    regs, threads = kernel.get("registers"), kernel.get("threads")
    if not regs or not threads:
        return None
    return REGS_PER_SM // (-(-regs // 8) * 8 * threads)


def kernel_notes(row: Row) -> list[str]:
    """What in a row's kernel numbers needs a look: spills, or fewer resident blocks than the budget planned."""
    k, where, notes = row.kernel, f"{row.precision} {row.size}", []
    if spilled(k):
        notes.append(
            f"- {where}: ptxas spills {k['spill_stores']} B stored / {k['spill_loads']} B loaded per thread "
            f"({k['registers']} registers, stack {k.get('stack', 0)} B)"
        )
    fits, planned = register_blocks(k), k.get("blocks_per_sm")
    if fits is not None and planned and fits < planned:
        notes.append(
            f"- {where}: {k['registers']} registers × {k['threads']} threads leave room for {fits} blocks/SM; "
            f"the budget planned {planned} (estimated {_get(k, 'regs_est')} registers)"
        )
    return notes


def kernel_table(rows: list[Row]) -> list[str]:
    """The kernel table's lines (none when no row has kernel numbers) and its notes."""
    with_kernel = [r for r in rows if r.kernel]
    if not with_kernel:
        return []
    lines = [
        "",
        "Kernels (plan: block osh×osw×ibw, sub-blocks, ring depth, sites; budget: threads, blocks/SM, dynamic smem B; "
        "ptxas: registers per thread (the budget's estimate), spill stores/loads B, static smem B):",
        "",
        "| " + " | ".join(KERNEL_COLUMNS) + " |",
        "|" + "---|" * len(KERNEL_COLUMNS),
    ]
    lines += ["| " + " | ".join(kernel_cells(r)) + " |" for r in with_kernel]
    notes = [n for r in with_kernel for n in kernel_notes(r)]
    if notes:
        lines += ["", "Kernel notes:", *notes]
    return lines


def write_report(outdir: str | Path, header: dict[str, Any], rows: list[Row]) -> tuple[Path, Path]:
    """gpucheck.json and gpucheck.md in `outdir` (created). Each file is replaced whole (written aside, then renamed),
    so a run killed while writing leaves the previous version, never half a file."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "gpucheck.json", out / "gpucheck.md"
    _write_whole(js, to_json(header, rows))
    _write_whole(md, to_markdown(header, rows))
    return js, md


def _write_whole(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
