"""The GPU check's attention rows (issue 32 item 6): `att:BATCHxHEADS:SEQ:HEAD_DIM[:causal]`, softmax attention of
BATCH·HEADS heads of SEQ queries and as many keys, fp16 or bf16, outputs O and LSE (`spatialc.attention`), FLOPs
4·seq_q·seq_kv·head_dim a head (Q·Kᵀ and P·V), half of that for a causal mask.

spatialc's contestants are the forms `spatialc.lower` prints attention in: the general form, and on a Hopper the sm_90a
form (built for sm_90a: TMA, wgmma); where a form does not print it (lower refuses it by one line) the row still runs,
that contestant `n/a` with lower's reason, so that the libraries' bar is measured on the device all the same.

The check, decided for the sizes here (16384 keys: the interpreter, and even the whole float64 reference, would cost
more than a row's time): O and LSE are checked on a sample — the first and the last head, and in each the first,
the middle and the last SAMPLE_ROWS query rows (a causal mask's shortest and longest rows among them) — against the
declared function in float64 on the device (`reference`: the formula of `numerics.attention.softmax_attention` on
those rows, every key), O within the GEMM rows' tolerance of the operand type (P is rounded to it before P·V: about
one rounding of each weight, as a GEMM's C in that type), LSE within float32's; poison left anywhere in O or LSE
is counted over the whole output, not the sample.

torch's contestants are `F.scaled_dot_product_attention` with each backend torch has (flash, memory-efficient,
cuDNN: `torch.nn.attention.sdpa_kernel`), on (batch, heads, seq, dim) views of the same values, and `flash_attn`'s
`flash_attn_func` where it imports (its (batch, seq, heads, dim) copies made beforehand); each O is checked on the
same sample within the libraries' tolerance; the fastest right one is the bar. None writes into a given O: every
contestant of the row is timed by events, the call as a caller makes it (kernel only is that call).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

ATTENTION_PRECISIONS = ("fp16", "bf16")  # the operand types spatialc.attention takes (and torch's SDPA)
SAMPLE_ROWS = 64  # query rows checked in each of three places of a sampled head
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cuDNN": "CUDNN_ATTENTION"}
FLASH_ATTN = "flash_attn.flash_attn_func"


def sdpa_name(backend: str) -> str:
    return f"torch SDPA ({backend})"


LIBRARIES = (*(sdpa_name(b) for b in SDPA_BACKENDS), FLASH_ATTN)


def parse_attention(text: str) -> tuple[tuple[int, int], tuple[int, int, int], bool] | None:
    """`att:16x16:4096:128:causal` → ((16, 16), (4096, 4096, 128), True); None for a size without the prefix."""
    from ..errors import SpatialError

    head, colon, rest = text.partition(":")
    if not colon or head.lower() != "att":
        return None
    parts = rest.lower().split(":")
    causal = parts[-1] == "causal"
    parts = parts[:-1] if causal else parts
    bh = parts[0].split("x") if parts else []
    nums = [*bh, *parts[1:]]
    if len(parts) != 3 or len(bh) != 2 or not all(p.isdigit() and int(p) >= 1 for p in nums):
        raise SpatialError(f"size {text!r} is not att:BATCHxHEADS:SEQ:HEAD_DIM[:causal]")
    seq, dim = int(parts[1]), int(parts[2])
    return (int(bh[0]), int(bh[1])), (seq, seq, dim), causal


# ---- building (on the CPU) --------------------------------------------------------------------------------------


def attention_case(built: Any, target: str) -> Any:
    """The attention program built and lowered in the general form; where lower refuses it, its general contestant
    absent with lower's line (the row runs the libraries all the same). On a Hopper (target sm_90) the same program
    built for sm_90a and lowered in the sm_90a form beside it (TMA, wgmma: `lower/cuda/sm90a/attention.py`), or
    absent with the reason, and as its neighbours (kernel only) its serial schedule and its bands of 128 rows, with
    and without the ping-pong."""
    import spatialc

    from ..lower.cuda.sm90a.overlap import OVERLAPPED, PINGPONG, SERIAL
    from .builds import Form, form_built, forms_of
    from .cases import HOPPER_FORM, one_line

    case = built.case
    (batch, heads), causal = case.heads, case.causal
    program = spatialc.attention(batch, heads, case.m, case.n, case.k, causal=causal, precision=case.precision)
    built.plan = f"{batch * heads} heads of {case.m} × {case.n}, head_dim {case.k}" + (", causal" if causal else "")
    hopper = []
    if target == "sm_90":
        # Beside the sm_90a form at its default schedule (each block's softmax overlapping the next block's S, where
        # its registers fit), the same plan with each matmul waited for: the neighbour it is timed against.
        # And bands of 128 rows, two consumer warpgroups (a block the planner does not choose), with and without
        # FlashAttention-3's ping-pong.
        planned, form = form_built(program, HOPPER_FORM, {"form": HOPPER_FORM})
        _, serial = form_built(program, HOPPER_FORM, {"form": HOPPER_FORM}, {"schedule": SERIAL})
        serial.variant, serial.kernel_only = f"{SERIAL} schedule", True
        hopper = [form, serial]
        if planned is not None:
            # Two consumer warpgroups, once interleaved as the warp schedulers take them (the overlapped schedule)
            # and once in FlashAttention-3's turns (the ping-pong, their default): the pair times the named barriers.
            b = planned.plans[0].block
            forced = {"form": HOPPER_FORM, "block": (8, b.ibw, 1)}
            _, two = form_built(program, HOPPER_FORM, forced, {"schedule": OVERLAPPED})
            two.variant, two.kernel_only = "two consumer warpgroups", True
            _, pingpong = form_built(program, HOPPER_FORM, forced, {"schedule": PINGPONG})
            pingpong.variant, pingpong.kernel_only = "two consumer warpgroups, ping-pong", True
            hopper += [two, pingpong]
    try:
        artifact = spatialc.lower(spatialc.build(program, target, form="general"), target, form="general")
    except Exception as e:
        built.forms = [Form("general", absent=f"lower: {one_line(e)}"), *hopper]
        return built
    built.forms = [*forms_of(artifact), *hopper]
    built.note = "; ".join(artifact.notes)
    return built


def contenders(case: Any, built: Any) -> list[str]:
    """What the dry run says each contestant of an attention row is timed for."""
    said = []
    for form in built.forms:
        said.append(
            f"{form.contestant}: {'kernel only + end to end' if form.artifact else 'n/a (' + form.absent + ')'}"
        )
    said += [f"{name}: kernel only (the call; events), where this torch has it" for name in LIBRARIES[:-1]]
    said.append(f"{FLASH_ATTN}: kernel only (the call; events), where it imports")
    said.append(f"checked: O and LSE on heads 0 and {case.heads[0] * case.heads[1] - 1}, rows of {SAMPLE_ROWS} ×3")
    return said


# ---- the sample and its reference ---------------------------------------------------------------------------------


def sample_rows(seq_q: int) -> list[int]:
    """The query rows checked in a sampled head: the first, the middle and the last SAMPLE_ROWS (fewer when short)."""
    n = min(SAMPLE_ROWS, seq_q)
    mid = max(0, seq_q // 2 - n // 2)
    return sorted({*range(n), *range(mid, mid + n), *range(seq_q - n, seq_q)})


def sample_heads(case: Any) -> list[int]:
    return sorted({0, case.heads[0] * case.heads[1] - 1})


def reference(q: Any, k: Any, v: Any, rows: list[int], scale: float, causal: bool, xp: Any) -> tuple[Any, Any]:
    """(O, LSE) of one head's `rows` in float64 (q, k, v: that head's float64 values, (seq, dim)): S = scale·Q·Kᵀ,
    −∞ past the causal mask (aligned bottom right), O = softmax(S)·V, LSE = log Σ exp(S)."""
    r = xp.asarray(rows)
    s = scale * (q[r] @ k.T)
    if causal:
        cols = xp.arange(k.shape[0])[None, :]
        s = xp.where(cols <= r[:, None] + (k.shape[0] - q.shape[0]), s, -xp.inf)
    m = xp.max(s, axis=1, keepdims=True)
    p = xp.exp(s - m)
    sums = xp.sum(p, axis=1, keepdims=True)
    return (p @ v) / sums, (m + xp.log(sums))[:, 0]


def check_sample(
    o: Any,
    lse: Any | None,
    refs: dict[int, tuple[Any, Any]],
    rows: list[int],
    elem: str,
    xp: Any,
    library: bool = False,
) -> tuple[bool, float, float]:
    """Whether O (and LSE, where given) of the sampled heads agree with their references: O within the tolerance of
    the operand type `elem` (the libraries': BASELINE_REL_TOL), LSE within float32's. (correct, max|ΔO|, ‖ΔO‖/‖O‖)."""
    from .agreement import _errors, _within

    r = xp.asarray(rows)
    got = xp.concatenate([o[h][r].astype(xp.float64) for h in refs])
    want = xp.concatenate([ref[0] for ref in refs.values()])
    max_abs, rel_fro, scale = _errors(got, want, xp)
    ok = _within(elem, max_abs, rel_fro, scale, library=library)
    if lse is not None:
        got_l = xp.concatenate([lse[h][r].reshape(-1).astype(xp.float64) for h in refs])
        want_l = xp.concatenate([ref[1] for ref in refs.values()])
        la, lr, ls = _errors(got_l, want_l, xp)
        ok = ok and _within("float32", la, lr, ls)
    return bool(ok), max_abs, rel_fro


# ---- on the device ------------------------------------------------------------------------------------------------


class AttentionRows:
    """Measures an attention row on the GPU runner's device (`device.GpuRunner`)."""

    def __init__(self, runner: Any):
        self.r, self.cp = runner, runner.cp

    def measure(self, case: Any, built: Any, row: Any, deadline: Any) -> None:
        from .agreement import values64
        from .cases import ELEM_OF, blaming
        from .device import settle
        from .preflight import REFERENCE

        self.r.row_graphs = False  # no library writes into a given O: every contestant timed by events
        q, k, v = self._inputs(case)
        rows, heads = sample_rows(case.m), sample_heads(case)
        scale = case.k**-0.5
        elem = ELEM_OF[case.precision]

        def refs() -> dict[int, tuple[Any, Any]]:
            vals = {h: [values64(x[h], elem, self.cp) for x in (q, k, v)] for h in heads}
            made = {h: reference(*vals[h], rows, scale, case.causal, self.cp) for h in heads}
            self.r._sync(deadline)
            return made

        sample = blaming(REFERENCE, refs)
        verdicts = [("error", built.error)] if built.error else []
        for form in built.forms:
            mine, verdict = self._spatialc(case, form, (q, k, v), sample, rows, deadline)
            row.contestants.append(mine)
            verdicts.append(verdict)
        row.status, row.note = settle(row.note, verdicts)
        for name in LIBRARIES:
            row.contestants.append(self._library(name, case, (q, k, v), sample, rows, deadline))

    def _inputs(self, case: Any) -> tuple[Any, Any, Any]:
        """Q, K and V, (heads, seq, dim) each, uniform in ±1 and stored in the operand type (bf16 as its bits)."""
        from ..runtime.tilize import bf16_bits

        cp, heads = self.cp, case.heads[0] * case.heads[1]
        rs = cp.random.RandomState(zlib.crc32(f"{self.r.seed} {case}".encode()))
        made = []
        for seq in (case.m, case.n, case.n):
            x = rs.uniform(-1.0, 1.0, size=(heads, seq, case.k), dtype=cp.float32)
            made.append(x.astype(cp.float16) if case.precision == "fp16" else bf16_bits(x, cp))
        return made[0], made[1], made[2]

    # ---- spatialc ------------------------------------------------------------------------------------------

    def _spatialc(
        self, case: Any, form: Any, qkv: tuple[Any, Any, Any], sample: Any, rows: list[int], deadline: Any
    ) -> tuple[Any, tuple[str, str]]:
        from .cases import Contestant

        if form.artifact is None:
            return Contestant(form.contestant, "spatialc", note=f"n/a: {form.absent}", facts=form.facts), ("", "")
        return self.r.guarded(case, form, lambda: self._kernel(case, form, qkv, sample, rows, deadline))

    def _kernel(
        self, case: Any, form: Any, qkv: tuple[Any, Any, Any], sample: Any, rows: list[int], deadline: Any
    ) -> tuple[Any, tuple[str, str]]:
        from .cases import ELEM_OF, Contestant
        from .device import same_error

        prep = self.r._prepare(form)
        named = dict(zip(("q", "k", "v"), qkv, strict=True))
        outs = prep.output_buffers(poison=True)

        def tiled() -> tuple[Any, ...]:
            return prep.order([prep.tiled(a, named[a.name]) for a in prep.args if a.role == "input"], outs)

        args = tiled()
        elem = ELEM_OF[case.precision]
        check = self._checked(prep, args, outs, sample, rows, elem, deadline)
        kernel = self.r._time(lambda i: prep.run(args), 1, deadline)
        again = self._checked(prep, args, outs, sample, rows, elem, deadline)
        check.stable = again.correct == check.correct and same_error(again.max_abs, check.max_abs)
        end_to_end = self.r._time(lambda i: prep.run(tiled()), 1, deadline, graphs=False)
        notes = []
        if not check.correct:
            notes.append(f"O or LSE wrong on the sample (max err {check.max_abs:.3g}, {check.unwritten} unwritten)")
        if not check.stable:
            notes.append("a second run on the same inputs gave another O")
        detail = (
            f"O and LSE stored as {'/'.join(sorted({a.elem for a in prep.outputs}))}, checked on heads "
            f"{', '.join(map(str, sample))} ({len(rows)} rows each); end to end adds tilizing Q, K and V"
        )
        mine = Contestant(
            form.contestant,
            "spatialc",
            end_to_end,
            kernel,
            check.max_abs,
            check.correct,
            detail,
            check=check,
            facts=form.facts,
        )
        status = "ok" if check.correct and check.stable else "wrong"
        return mine, (status, f"{form.contestant}: {'; '.join(notes)}" if notes else "")

    def _checked(
        self, prep: Any, args: Any, outs: dict[str, Any], sample: Any, rows: list[int], elem: str, deadline: Any
    ) -> Any:
        """One launch into poisoned O and LSE, the sample checked and the poison left counted over both."""
        from ..runtime.tilize import poison_value, unwritten
        from .agreement import Check, values64

        for name, out in outs.items():
            out.fill(poison_value(prep.output_arg(name).storage))
        prep.run(args)
        self.r._sync(deadline)
        got = {a.name: prep.result(outs[a.name], a.name) for a in prep.outputs}
        left = sum(unwritten(got[a.name], a.storage, self.cp) for a in prep.outputs)
        o, lse = (values64(got[a.name], a.elem, self.cp) for a in prep.outputs)
        ok, max_abs, rel_fro = check_sample(o, lse, sample, rows, elem, self.cp)
        return Check(ok and left == 0, max_abs, rel_fro, left, 0, 0)

    # ---- the libraries -------------------------------------------------------------------------------------

    def _library(
        self, name: str, case: Any, qkv: tuple[Any, Any, Any], sample: Any, rows: list[int], deadline: Any
    ) -> Any:
        from .agreement import values64
        from .cases import ELEM_OF, Contestant

        def measure() -> Any:
            call, why = self._call(name, case, qkv)
            if call is None:
                return Contestant(name, "torch", note=f"unavailable: {why}")
            o = call()
            self.r._sync(deadline)
            o = values64(self.r.libs.from_torch(o), ELEM_OF[case.precision], self.cp)
            ok, max_abs, _ = check_sample(o, None, sample, rows, ELEM_OF[case.precision], self.cp, library=True)
            if not ok:
                return Contestant(name, "torch", max_abs=max_abs, ok=False, detail=why, note="wrong; not timed")
            kernel = self.r._time(lambda i: call(), 1, deadline)
            return Contestant(name, "torch", None, kernel, max_abs, True, why)

        return self.r.library_guarded(name, "torch", measure, deadline)

    def _call(self, name: str, case: Any, qkv: tuple[Any, Any, Any]) -> tuple[Callable[[], Any] | None, str]:
        """The library call giving O as (heads, seq, dim), and what it is; (None, why) where it is not here."""
        torch = self.r.torch
        batch, heads = case.heads
        t = [self.r.libs.to_torch(x, case.precision) for x in qkv]
        if name == FLASH_ATTN:
            try:
                from flash_attn import flash_attn_func  # type: ignore[import-not-found]
            except Exception as e:
                return None, f"flash_attn does not import ({type(e).__name__})"
            bshd = [x.reshape(batch, heads, -1, case.k).transpose(1, 2).contiguous() for x in t]

            def flash() -> Any:
                o = flash_attn_func(*bshd, causal=case.causal)
                return o.transpose(1, 2).reshape(batch * heads, -1, case.k)

            return flash, "(batch, seq, heads, dim) copies made beforehand; O read back through a transposed view"
        backend = next(b for b in SDPA_BACKENDS if sdpa_name(b) == name)
        attention = getattr(getattr(torch, "nn", None), "attention", None)
        which = getattr(getattr(attention, "SDPBackend", None), SDPA_BACKENDS[backend], None)
        if which is None:
            return None, f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[backend]}"
        bhsd = [x.reshape(batch, heads, -1, case.k) for x in t]
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def call() -> Any:
            with attention.sdpa_kernel(which):
                return sdpa(*bhsd, is_causal=case.causal).reshape(batch * heads, -1, case.k)

        return call, f"F.scaled_dot_product_attention under sdpa_kernel({SDPA_BACKENDS[backend]}), (b, h, s, d) views"


# ---- the report -------------------------------------------------------------------------------------------------


def attention_summary(row: Any) -> dict[str, Any]:
    """Kernel only: each spatialc form's TFLOP/s and its share of the fastest right library's (the bar: an SDPA
    backend or flash_attn, named), the row's own rates (4·seq_q·seq_kv·head_dim a head, half for causal)."""
    from .rates import best, rate

    bar = best(row, "torch", "kernel")
    bar_s = bar.kernel.median_s if bar is not None and bar.kernel is not None else None
    forms = {}
    for c in (c for c in row.contestants if c.family == "spatialc"):
        right = c.ok and c.kernel is not None
        mine = c.kernel.median_s if right and c.kernel is not None else None
        forms[c.name] = {"rate": rate(row.ops, mine), "pct_of_bar": 100.0 * bar_s / mine if mine and bar_s else None}
    return {"bar": None if bar is None else {"name": bar.name, "rate": rate(row.ops, bar_s)}, "spatialc": forms}


def attention_lines(rows: list[Any]) -> list[str]:
    """The attention rows against their bar, kernel only (none without attention rows)."""
    out = []
    for r in (r for r in rows if r.heads[0]):
        s = attention_summary(r)
        bar = f"{s['bar']['name']} {s['bar']['rate']:.1f} TFLOP/s" if s["bar"] else "no right library"
        each = "; ".join(
            f"{name} {v['rate']:.1f} TFLOP/s" + (f", {v['pct_of_bar']:.0f}% of the bar" if v["pct_of_bar"] else "")
            if v["rate"]
            else f"{name} —"
            for name, v in s["spatialc"].items()
        )
        out.append(f"- {r.precision} {r.size}: {each or 'no spatialc kernel'}; bar: {bar}")
    if not out:
        return []
    head = (
        "Attention, kernel only (every contestant timed by events), against the fastest right library (torch's SDPA "
        "backends, flash_attn): TFLOP/s of 4·seq_q·seq_kv·head_dim a head, half for causal (— where a kernel was "
        "wrong or did not run):"
    )
    return ["", head, "", *out]
