"""The GPU check's report: rows in; rates, the fastest library each way, % of it, JSON and Markdown out. No GPU.

Every row compares spatialc's kernels — the persistent kernel, its general form and (on sm_90) the sm_90a form of
the same GEMM built for sm_90a, side by side — with each
library twice, like for like: end to end (row-major A and B in, row-major C out in torch's type, every copy and
conversion included) and kernel only (operands already in each contestant's own layout). Of each library family the
fastest contestant whose result was right counts, and its name is in the table.

A map row (an elementwise program, `map:KIND:MxN`: gpucheck/maps.py) has a table of its own, in GB/s of the bytes it
reads and writes: spatialc's general form against torch's formula and the device's copy bandwidth. A fused row (a GEMM
with scales and a residual in its epilogue, `fused:SIZE`: gpucheck/fused.py) is in the main table, and below it each
form's fused kernel against the plain GEMM's of the same size, timed in the same row. An attention row (`att:`:
gpucheck/attnrows.py) is in the main table too, and below it each form against the fastest library, kernel only.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..files import write_whole
from .agreement import TOLERANCE
from .attnrows import attention_lines, attention_summary
from .builds import spilled
from .cases import (
    FORMS,
    HOPPER_FORM,
    PLANNERS_PLAN,
    SAME_SPEED,
    TIMED_AGAIN,
    WAYS,
    Contestant,
    Row,
    Timing,
    probe_result,
    spatialc_name,
)
from .fused import fused_lines, fused_summary
from .maptable import map_lines, map_summary
from .rates import (
    UNIT,
    _cell,
    _correct,
    _err,
    _median,
    _pct,
    _per_form,
    _rate,
    _timed,
    best,
    percent_of,
    rate,
    share_of,
    size_cell,
    unit_of,
)
from .w4rows import w4_lines, w4_summary

HEADER_KEYS = ("date", "state", "gpu", "sms", "clocks", "commit", "target", "budget_s", "elapsed_s", "versions")
NOTE_KEYS = ("prepared", "outputs", "timing", "kernel_timing")
LIBRARIES = ("cublas", "triton")  # the families spatialc's kernels are compared with


def row_dict(row: Row) -> dict[str, Any]:
    """A row with its derived rates, for the JSON report: each way, the fastest right contestant of each library
    family and each spatialc kernel's rate and percentage of them."""
    d = asdict(row)
    d["size"], d["unit"], d["ops"] = row.size, unit_of(row), row.ops  # ops: the rates' work (a map's: its bytes)
    if row.map:
        d["map_timings"] = map_summary(row)  # its rates in GB/s; d["map"] stays its kind
        return d
    if row.weights:
        d["w4_timings"] = w4_summary(row)  # kernel only, in GB/s of the weights, against torch and the copy
        return d
    d["timings"] = {}
    for way in WAYS:
        summary: dict[str, Any] = {"spatialc": {form: _form_summary(row, way, form) for form in FORMS}}
        for family in LIBRARIES:
            ref = best(row, family, way)
            fastest = None if ref is None else {"name": ref.name, "rate": rate(row.ops, _median(ref.timing(way)))}
            summary[f"{family}_best"] = fastest
        d["timings"][way] = summary
    if row.sweep:
        d["sweep"] = sweep_summary(row)
    if row.fused:
        d["fused_timings"] = fused_summary(row)  # each form's fused kernel against the plain GEMM's
    if row.heads[0]:
        d["attention_timings"] = attention_summary(row)  # each form against the fastest SDPA backend or flash_attn
    return d


# ---- a sweep row's plans ---------------------------------------------------------------------------------------


def sweep_plans(row: Row) -> list[Contestant]:
    """A sweep row's kernels, form by form, each form's planner's plan first (each carries `facts['sweep']`)."""
    return [c for c in row.contestants if c.family == "spatialc" and "sweep" in c.facts]


def _kernel_s(c: Contestant) -> float | None:
    """A plan's kernel time, where its result was right (a wrong kernel's speed says nothing)."""
    right = c.check is not None and c.check.correct and c.check.stable is not False
    return _median(c.kernel) if right else None


def sweep_summary(row: Row) -> list[dict[str, Any]]:
    """Each plan of a sweep row: its form, what changed, its planner's predicted speed against the planner's own
    plan, the measured one (the planner's plan's kernel time — the mean of its two timings, before and after the
    neighbours — over this plan's), its rate and its share of the fastest cuBLAS kernel."""
    plans = sweep_plans(row)
    base = {form: _planner_s(plans, form) for form in dict.fromkeys(c.facts["sweep"]["form"] for c in plans)}
    out = []
    for c in plans:
        sweep, t = c.facts["sweep"], _kernel_s(c)
        planner = base.get(sweep["form"])
        out.append(
            {
                "contestant": c.name,
                "form": sweep["form"],
                "plan": _plan_label(c),
                "change": sweep["change"],
                "predicted": sweep["predicted"],
                "measured": planner / t if planner and t else None,
                "rate": rate(row.ops, t),
                "pct_of_cublas": share_of(row, "cublas", "kernel", t),
            }
        )
    return out


OWN = (PLANNERS_PLAN, TIMED_AGAIN)  # a sweep's timings of the planner's own plan


def _planner_s(plans: list[Contestant], form: str) -> float | None:
    """A form's planner's kernel time: the mean of its timings (before and after the neighbours) that were right."""
    times = [_kernel_s(c) for c in plans if c.facts["sweep"]["form"] == form and c.facts["sweep"]["change"] in OWN]
    right = [t for t in times if t]
    return sum(right) / len(right) if right else None


def _plan_label(c: Contestant) -> str:
    """A sweep plan as its contestant names it (`sm90a 8×16×4 d3`); the planner's own by its numbers."""
    label, form = c.name.removeprefix("spatialc ").strip(), c.facts["sweep"]["form"]
    if label != form:
        return label
    k = c.facts
    sub = "" if k.get("sub_blocks", "1×1") == "1×1" else f" sub {k['sub_blocks']}"
    return f"{form} {k.get('block', '?')}{sub} d{k.get('depth', '?')} (the planner's)"


def concordance(plans: list[dict[str, Any]], tie: float = SAME_SPEED) -> tuple[int, int]:
    """Of the pairs of a form's plans that the planner's cost tells apart and that measured apart, each by more than
    `tie` (relative), how many the cost ordered as the kernel times did (agreeing, compared). The planner's plan
    timed again is not a plan of its own."""
    known = [
        p for p in plans if p["predicted"] is not None and p["measured"] is not None and p["change"] != TIMED_AGAIN
    ]
    agree = total = 0
    for i, p in enumerate(known):
        for q in known[i + 1 :]:
            if _close(p["predicted"], q["predicted"], tie) or _close(p["measured"], q["measured"], tie):
                continue
            total += 1
            agree += (p["predicted"] > q["predicted"]) == (p["measured"] > q["measured"])
    return agree, total


def _close(x: float, y: float, tie: float) -> bool:
    return abs(x - y) <= tie * max(abs(x), abs(y))


def sweep_verdict(plans: list[dict[str, Any]], tie: float = SAME_SPEED) -> tuple[dict[str, Any] | None, str]:
    """A form's winner among its right plans and what to say of it: a neighbour only where it beat the planner's
    plan by more than `tie` (or by more than the planner's two timings differ), else the planner's plan."""
    own = [p for p in plans if p["change"] in OWN and p["measured"]]
    drift = max((abs(p["measured"] - 1) for p in own), default=0.0)  # each of the two against their mean
    margin = max(tie, 2 * drift)
    rivals = [p for p in plans if p["change"] not in OWN and p["measured"]]
    best = max(rivals, key=lambda p: p["measured"], default=None)
    planner = next((p for p in plans if p["change"] == PLANNERS_PLAN and p["measured"]), None)
    again = f"the planner's two timings {2 * drift:.1%} apart" if len(own) > 1 else "the planner's plan timed once"
    if best is not None and (planner is None or best["measured"] > 1 + margin):
        return best, f"{best['measured']:.2f}× the planner's plan ({again})"
    if planner is None:
        return None, "no plan ran right"
    near = f"; the nearest, {best['plan']}, {best['measured']:.2f}×" if best is not None else ""
    return planner, f"no neighbour more than {margin:.0%} faster ({again}){near}"


def _form_summary(row: Row, way: str, form: str) -> dict[str, Any]:
    """The rate `way` of spatialc's kernel in `form` and its percentage of each library family's fastest."""
    mine = row.spatialc(form)
    summary: dict[str, Any] = {"rate": rate(row.ops, _median(mine.timing(way) if mine else None))}
    for family in LIBRARIES:
        summary[f"pct_of_{family}"] = percent_of(row, family, way, form)
    return summary


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


# ---- Markdown ----------------------------------------------------------------------------------------------------

COLUMNS = (
    "precision",
    "m×n×k",
    *(f"{spatialc_name(form)} e2e" for form in FORMS),
    "cuBLAS e2e (fastest)",
    "% cuBLAS e2e",
    *(f"{spatialc_name(form)} kernel" for form in FORMS),
    "cuBLAS kernel (fastest)",
    "% cuBLAS kernel",
    "Triton e2e",
    "% Triton e2e",
    "max err",
    "correct",
    "status",
)
# Below the table: how its cells that hold a value per spatialc kernel read.
PER_FORM = f"% columns, max err and correct give each spatialc kernel's: {' / '.join(FORMS)}."


def table_cells(row: Row) -> list[str]:
    """One line of the main table: each spatialc kernel's rate beside the fastest library's, each way."""
    unit, mine = UNIT.get(row.precision, "TOP/s"), [row.spatialc(form) for form in FORMS]
    cells = [row.precision, size_cell(row)]
    for way in WAYS:
        cells += [f"{_timed(row, c.timing(way) if c else None)} {unit}" for c in mine]
        ref = best(row, "cublas", way)
        cells.append("—" if ref is None else f"{_timed(row, ref.timing(way))} ({ref.name})")
        cells.append(_per_form([_pct(percent_of(row, "cublas", way, form)) for form in FORMS]))
    tri = best(row, "triton", "end_to_end")
    cells.append("—" if tri is None else _timed(row, tri.end_to_end))
    cells.append(_per_form([_pct(percent_of(row, "triton", "end_to_end", form)) for form in FORMS]))
    errors = _per_form([_err(c.check if c else None) for c in mine])
    status = row.status + (f": {row.note}" if row.note else "")
    return [_cell(c) for c in [*cells, errors, _per_form([_correct(c) for c in mine]), status]]


def _how(t: Timing | None) -> str:
    if t is None:
        return ""
    how = f"{t.method} ×{t.per_batch}, {t.reps} reps"
    return how + (f" ({t.note})" if t.note else "")


def contestant_lines(rows: list[Row]) -> list[str]:
    """The table of every contestant of every row that ran: both timings, how they were taken, the result."""
    lines = [
        "| precision | m×n×k | contestant | end to end | kernel only | timed (e2e; kernel) | result | detail |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for c in r.contestants:
            result = (
                "—"
                if c.ok is None
                else ("right" if c.ok else "WRONG") + (f" ({c.max_abs:.3g})" if c.max_abs is not None else "")
            )
            how = "; ".join(x for x in (_how(c.end_to_end), _how(c.kernel)) if x) or "—"
            cells = [r.precision, size_cell(r), c.name, _timed(r, c.end_to_end)]
            cells += [_timed(r, c.kernel), how, result, c.note or c.detail]
            lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return lines if len(lines) > 2 else []


def preflight_lines(header: dict[str, Any]) -> list[str]:
    probes = header.get("preflight")
    if not probes:
        return []
    lines = ["", f"Preflight ({sum(p['seconds'] for p in probes):.1f} s):", "", "| step | result | s | detail |"]
    lines.append("|---|---|---|---|")
    for p in probes:
        cells = (p["name"], probe_result(p["ok"], p.get("marked", False)), p["seconds"], p["detail"])
        lines.append("| " + " | ".join(_cell(str(x)) for x in cells) + " |")
    return lines


def header_lines(header: dict[str, Any]) -> list[str]:
    lines = [f"- {key}: {header[key]}" for key in HEADER_KEYS if key in header]
    lines += [f"- ⚠ {w}" for w in header.get("warnings", [])]
    lines += [f"- ⚠ restart {i}: {r}" for i, r in enumerate(header.get("restarts", []), 1)]
    lines += [f"- {key.replace('_', ' ')}: {header[key]}" for key in NOTE_KEYS if header.get(key)]
    tol = "; ".join(f"{elem} C: ‖C−R‖_F/‖R‖_F ≤ {r:g}, max|C−R| ≤ {a:g}·max|R|" for elem, (r, a) in TOLERANCE.items())
    lines.append(f"- tolerance: integer C exact; {tol} (operands exact; fp32 accumulation, one rounding of C)")
    return lines


def to_markdown(header: dict[str, Any], rows: list[Row]) -> str:
    """The report as Markdown: the header, the preflight, the main table, the maps', every contestant, the
    kernels."""
    lines = ["# spatialc GPU check", "", *header_lines(header), *preflight_lines(header)]
    products = [r for r in rows if not r.map and not r.weights]  # tables of their own: maptable.py, w4rows.py

    if products or not rows:
        lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(table_cells(r)) + " |" for r in products]
        lines += ["", PER_FORM]
    lines += map_lines(rows)
    lines += w4_lines(rows)
    timings = [c.timing(w) for r in rows for c in r.contestants for w in WAYS]
    if any(t is not None and t.launch_bound for t in timings):
        lines += ["", "‡ launch-bound: the host issued the launches no faster than the device ran them."]
    contestants = contestant_lines(rows)
    if contestants:
        lines += ["", "Contestants (rates as in the tables; e2e = end to end):", "", *contestants]
    lines += multicast_lines(rows)
    lines += fused_lines(rows)
    lines += attention_lines(rows)
    lines += sweep_lines(rows)
    lines += kernel_table(rows)
    return "\n".join(lines) + "\n"


def multicast_lines(rows: list[Row]) -> list[str]:
    """Each multicast row's kernels against the same GEMM's without groups, in the same run, form by form (the
    general form's groups copy pages through distributed shared memory, the sm_90a form's are TMA multicasts): the
    ratio of their median kernel times (above 1: the groups are faster)."""
    plain = {
        (r.precision, r.m, r.n, r.k): r
        for r in rows
        if r.multicast == (1, 1) and r.groups == 1 and not r.sweep and not r.map and not r.fused
    }
    out = []
    for r in rows:
        if r.multicast == (1, 1):
            continue
        base = plain.get((r.precision, r.m, r.n, r.k))
        for form in ("general", HOPPER_FORM):
            ours = r.spatialc(form)
            if ours is None:
                continue
            theirs = base.spatialc(form) if base is not None else None
            t_ours = _median(ours.timing("kernel")) if ours.ok else None
            t_base = _median(theirs.timing("kernel")) if theirs is not None and theirs.ok else None
            said = f"{t_base / t_ours:.2f}×" if t_ours and t_base else "— (one of the two has no right, timed kernel)"
            out.append(f"- {r.precision} {r.size}: {form} form without groups / with them, kernel time: {said}")
    return ["", "Multicast groups against the same GEMM without groups (kernel only):", "", *out] if out else []


SWEEP_COLUMNS = (
    "precision",
    "m×n×k",
    "plan",
    "change",
    "predicted",
    "measured",
    "kernel",
    "% cuBLAS kernel",
    "correct",
    "regs",
    "spill st/ld",
    "dyn smem",
)


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def sweep_lines(rows: list[Row]) -> list[str]:
    """The sweep rows' plans, one line each: the planner's prediction beside the measured speed, both against the
    form's planner's own plan; then, per row and form, the winner (a neighbour only beyond timing noise) and how often
    the planner's cost ordered two plans as measured."""
    swept = [r for r in rows if r.sweep and sweep_plans(r)]
    if not swept:
        return []
    lines = [
        "",
        "The plan sweep (sweep rows, kernel only; each form's plans against its planner's own choice — predicted: by "
        "the planner's cost, measured: the planner's plan's kernel time, the mean of its timings before and after "
        f"its neighbours, over this plan's; ★ a form's fastest right plan, a neighbour only when more than "
        f"{SAME_SPEED:.0%} faster; a plan the form or the machine cannot take says why):",
        "",
        "| " + " | ".join(SWEEP_COLUMNS) + " |",
        "|" + "---|" * len(SWEEP_COLUMNS),
    ]
    verdicts = []
    for r in swept:
        unit = UNIT.get(r.precision, "TOP/s")
        summary = sweep_summary(r)
        winners = []
        for form in dict.fromkeys(s["form"] for s in summary):
            mine = [s for s in summary if s["form"] == form]
            winner, said = sweep_verdict(mine)
            winners.append(winner)
            agree, total = concordance(mine)
            model = f"; its planner's cost ordered {agree} of {total} pairs of plans as measured" if total else ""
            head = f"★ {winner['plan']} at {_rate(winner['rate'])} {unit}: " if winner is not None else ""
            verdicts.append(f"- {r.precision} {r.size}, {form}: {head}{said}{model}")
        for c, s in zip(sweep_plans(r), summary, strict=True):
            k = c.facts
            star = " ★" if any(w is s for w in winners) else ""
            regs = str(k["registers"]) if "registers" in k else "—"
            spills = f"{k['spill_stores']}/{k['spill_loads']}" if "registers" in k else "—"
            kernel = f"{_rate(s['rate'])} {unit}{star}" if s["rate"] else (c.note or "—")
            cells = [r.precision, size_cell(r), s["plan"]]
            cells += [s["change"], _ratio(s["predicted"]), _ratio(s["measured"]), kernel, _pct(s["pct_of_cublas"])]
            cells += [_correct(c), regs, spills, _get(k, "dyn_smem")]
            lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return lines + (["", *verdicts] if verdicts else [])


KERNEL_COLUMNS = (
    "precision",
    "m×n×k",
    "form",
    "block",
    "sub",
    "depth",
    "sites",
    "threads",
    "blocks/SM",
    "dyn smem",
    "C",
    "regs (est)",
    "spill st/ld",
    "static smem",
    "cubin",
)
REGS_PER_SM = 65536  # the register file of one SM (sm_80 … sm_90)


def _get(kernel: dict[str, Any], key: str) -> str:
    value = kernel.get(key)
    return "—" if value is None else str(value)


def kernels(row: Row) -> list[tuple[str, dict[str, Any]]]:
    """Each of a row's spatialc kernels that has numbers, by form, with the plan's numbers they share; the plan's
    alone (form —) when none has any."""
    found = [(form, {**row.kernel, **c.facts}) for form in FORMS if (c := row.spatialc(form)) and c.facts]
    return found or ([("—", row.kernel)] if row.kernel else [])


def kernel_cells(row: Row, form: str, k: dict[str, Any]) -> list[str]:
    """One line of the kernel table: the plan, the budget, C's type, what ptxas said (bytes), the cubin's origin
    of the row's kernel in `form` (`k`: its numbers)."""
    if "registers" in k:
        regs = f"{k['registers']} ({_get(k, 'regs_est')})"
        spills = f"{k['spill_stores']}/{k['spill_loads']}" + (" ⚠" if spilled(k) else "")
        static = str(k["static_smem"])
    else:
        regs, spills, static = f"— ({_get(k, 'regs_est')})", str(k.get("ptxas", "")) or "—", "—"
    cells = [row.precision, size_cell(row), form, _get(k, "block"), _get(k, "sub_blocks")]
    sites = _get(k, "sites") + (f" ({k['sites_run']})" if k.get("sites_run", k.get("sites")) != k.get("sites") else "")
    sites += f", split-K {k['splits']}" if k.get("splits", 1) > 1 else ""
    cells += [_get(k, "depth"), sites, _get(k, "threads"), _get(k, "blocks_per_sm"), _get(k, "dyn_smem")]
    return [_cell(c) for c in [*cells, _get(k, "c_elem"), regs, spills, static, _get(k, "cubin")]]


def register_blocks(kernel: dict[str, Any]) -> int | None:
    """Blocks per SM the register file allows at ptxas's count (allocated in steps of 8 per thread)."""
    regs, threads = kernel.get("registers"), kernel.get("threads")
    if not regs or not threads:
        return None
    return REGS_PER_SM // (-(-regs // 8) * 8 * threads)


def kernel_notes(row: Row, form: str, k: dict[str, Any]) -> list[str]:
    """What in the numbers `k` of a row's kernel in `form` needs a look: spills, fewer resident blocks than the
    budget planned, or a preflight kernel of its form that computed a wrong C."""
    where, notes = f"{row} {form}", []
    if spilled(k):
        notes.append(
            f"- {where}: ptxas spills {k['spill_stores']} B stored / {k['spill_loads']} B loaded per thread "
            f"({k['registers']} registers, stack {k.get('stack', 0)} B)"
        )
    if k.get("preflight"):
        notes.append(f"- {where}: {k['preflight']}; kept, and this row checked its own C")
    fits, planned = register_blocks(k), k.get("blocks_per_sm")
    if fits is not None and planned and fits < planned:
        notes.append(
            f"- {where}: {k['registers']} registers × {k['threads']} threads leave room for {fits} blocks/SM; "
            f"the budget planned {planned} (estimated {_get(k, 'regs_est')} registers)"
        )
    return notes


def kernel_table(rows: list[Row]) -> list[str]:
    """The kernel table's lines (none when no row has kernel numbers) and its notes."""
    found = [(r, form, k) for r in rows for form, k in kernels(r)]
    if not found:
        return []
    lines = [
        "",
        "Kernels (form: the persistent kernel, its general form or the sm_90a form, one line each; "
        "plan: block osh×osw×ibw, sub-blocks, ring depth, sites (those run, where the device made them "
        "differ); budget: threads, blocks/SM, dynamic smem B; "
        "C's element type; ptxas: registers per thread (the budget's estimate), spill stores/loads B, static smem B; "
        "where the cubin came from):",
        "",
        "| " + " | ".join(KERNEL_COLUMNS) + " |",
        "|" + "---|" * len(KERNEL_COLUMNS),
    ]
    lines += ["| " + " | ".join(kernel_cells(r, form, k)) + " |" for r, form, k in found]
    notes = [n for r, form, k in found for n in kernel_notes(r, form, k)]
    if notes:
        lines += ["", "Kernel notes:", *notes]
    return lines


def write_report(outdir: str | Path, header: dict[str, Any], rows: list[Row]) -> tuple[Path, Path]:
    """gpucheck.json and gpucheck.md in `outdir` (created). Each file is replaced whole (written aside, then renamed),
    so a run killed while writing leaves the previous version, never half a file."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "gpucheck.json", out / "gpucheck.md"
    write_whole(js, to_json(header, rows))
    write_whole(md, to_markdown(header, rows))
    return js, md
