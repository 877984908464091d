"""OCP MX block scales for 8-bit floats (MXFP8, issue 34 items 1, 2, 6): `gemm(..., "e4m3", scales="mx")` — one
float8_e8m0fnu scale per 32 of K of each row of A and each column of B, promoted every 32. The frontend's layouts,
types and checks; the scale inputs taken as numerics/w4.py takes e8m0 (ml_dtypes arrays or powers of two, nothing
else); the interpreter equal to the reference bit for bit and to a sum written apart from it, the kernel's bound
with 32 for 128, held against a float32 accumulator's worst roundings at K = 4096; a grouped GEMM's; the sm_90a
form's one-line refusal; the CLI's `--scales mx`. (The kernels: test_mx_kernels.py; rule 8: test_mx_mutations.py.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import spatialc
from spatialc.cli import main
from spatialc.errors import ProgramError, SpatialError
from spatialc.inputs import InputError
from spatialc.ir import serde
from spatialc.ir.nodes import DType
from spatialc.numerics.blockscale import MX_K, is_mx, kernel_ulps, program_scales, promotion_k
from spatialc.numerics.reference import reference

from .programs import FORMATS, inputs_of, naive, scaled

E8M0 = ml_dtypes.float8_e8m0fnu


def test_mx_names_one_e8m0_scale_per_32_of_k_of_each_row_and_column():
    p = scaled(40, 72, 200, scales="mx")
    q = scaled(40, 72, 200, scales=(" 1X32", "32x1 "))  # the layouts spelled out are the same program
    assert p.tensors == q.tensors and p.stages == q.stages
    s = program_scales(p)
    assert s is not None and (s.a.outer, s.a.k, s.b.outer, s.b.k) == (1, MX_K, 1, MX_K)
    sa, sb = p.tensor(s.a.tensor), p.tensor(s.b.tensor)
    assert (sa.name, sa.dtype, sa.elems) == ("scale_a", DType.E8M0, (40, 7))  # ⌈200 / 32⌉ groups
    assert (sb.name, sb.dtype, sb.elems) == ("scale_b", DType.E8M0, (7, 72))
    assert is_mx(p) and promotion_k(p) == 32 and p.plans[0].block.ibw == 2  # a K step: one k32 MMA
    plain = scaled(40, 72, 256)
    assert not is_mx(plain) and promotion_k(plain) == 128
    assert plain.tensor(program_scales(plain).a.tensor).dtype == DType.FLOAT32


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"scales": ("1x32", "128x128")}, r"groups 32 elements of K .*use scales='mx'"),
        ({"scales": ("1x128", "32x1")}, r"groups 32 elements of K .*use scales='mx'"),
        ({"scales": "mxfp8"}, r"a pair of layout names, A's and B's, or 'mx', not 'mxfp8'"),
        ({"scales": "mx", "prec": "bf16"}, r"block scales are for 8-bit float operands"),
        ({"scales": "mx", "block": (2, 2, 8)}, r"K step is its promotion interval, 2 tiles \(32 elements\)"),
    ],
)
def test_what_mx_refuses(kw, message):
    with pytest.raises(ProgramError, match=message):
        scaled(32, 32, 256, **kw)


def mx_inputs(p, seed=0):
    """inputs_of's, each e8m0 scale array also given as float64 powers of two."""
    ins = inputs_of(p, seed=seed)
    return ins, {**ins, "scale_a": ins["scale_a"].astype(np.float64), "scale_b": ins["scale_b"].astype(np.float64)}


@pytest.mark.parametrize(("shape", "prec"), [((64, 48, 256), "e4m3"), ((37, 70, 200), "e5m2")])
def test_interpreter_is_the_reference_and_the_definition(shape, prec):
    p = scaled(*shape, scales="mx", prec=prec)
    ins, as_floats = mx_inputs(p)
    assert ins["scale_a"].dtype == E8M0
    c = spatialc.evaluate(p, ins)
    assert np.array_equal(c, reference(p, ins))  # the same operations in the same order
    assert np.array_equal(c, naive(p, ins, step=32).astype(np.float32))  # the float64 sum rounded once
    assert np.array_equal(c, spatialc.evaluate(p, as_floats))  # powers of two as floats: the same scales
    assert not np.array_equal(c, naive(p, ins, step=128).astype(np.float32))  # the group is 32, not 128
    tol = spatialc.tolerance(p, kernel=True)
    assert tol.ulps == kernel_ulps(shape[2], step=32) == 32 + -(-shape[2] // 32) + 4
    assert "promoted every 32 of K" in tol.text
    ok, how = tol.check(c, ins)
    assert ok, how


def float32_kernel(a, b, sa, sb):
    """C as an MX kernel computes it, in numpy: each step's 32 products summed in float32 in K order (exact here),
    promoted into the float32 accumulator with one rounding (the fused multiply-add), steps in K order."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    sa, sb = sa.astype(np.float64), sb.astype(np.float64)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for g in range(a.shape[1] // MX_K):
        part = a[:, g * MX_K : (g + 1) * MX_K] @ b[g * MX_K : (g + 1) * MX_K]
        acc = (part.astype(np.float64) * (sa[:, g, None] * sb[None, g, :]) + acc).astype(np.float32)
    return acc


def test_the_kernel_bound_holds_over_an_accumulators_worst_roundings_at_k_4096():
    """The bound's G term against a computed error: group 0 puts 2^25 in the accumulator (ulp 4), each of the 127
    groups after it adds 31 · 2^-4 = 1.9375, just under half an ulp, lost every time — 61.5 ulps of M in all. The
    kernel's 164 holds it; the interpreter's 4 does not, nor the bound without its ⌈K / 32⌉ (32 + 4)."""
    p = scaled(16, 16, 4096, scales="mx")
    fmt = FORMATS["e4m3"]
    a = np.ones((16, 4096))
    a[:, MX_K - 1 :: MX_K] = 0  # 31 ones a group: its partial sum 31
    a[:, MX_K - 1] = 1  # but group 0's 32
    codes = np.full((16, 4096 // MX_K), 123)  # 2^-4
    codes[:, 0] = 147  # 2^20
    ins = {"A": a.astype(fmt), "B": np.ones((4096, 16)).astype(fmt)}
    ins |= {"scale_a": np.exp2(codes - 127.0).astype(E8M0), "scale_b": np.ones((4096 // MX_K, 16)).astype(E8M0)}
    c = float32_kernel(ins["A"], ins["B"], ins["scale_a"], ins["scale_b"])
    want = 2.0**25 + 127 * 1.9375
    assert np.all(c == 2.0**25) and np.all(spatialc.evaluate(p, ins) == np.float32(want))
    ulps = (want - 2.0**25) / (want * 2.0**-23)  # the error in float32 ulps of M (= C: all terms positive)
    tol = spatialc.tolerance(p, kernel=True)
    assert MX_K + 4 < ulps < tol.ulps == kernel_ulps(4096, step=MX_K)
    ok, how = tol.check(c, ins)
    assert ok, how
    assert not spatialc.tolerance(p).check(c, ins)[0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (3.0, r"scale_a\[0, 0\] = 3 is not one of its powers of two 2\^-127 … 2\^127 \(float8_e8m0fnu\)"),
        (0.0, r"scale_a\[0, 0\] = 0 is not one of its powers of two"),
        (2.0**128, r"is not one of its powers of two"),
    ],
)
def test_a_scale_that_is_no_e8m0_value_is_refused(value, message):
    p = scaled(32, 32, 64, scales="mx")
    _, ins = mx_inputs(p)
    ins["scale_a"][0, 0] = value
    with pytest.raises(InputError, match=message):
        spatialc.evaluate(p, ins)
    with pytest.raises(InputError, match=message):
        spatialc.tolerance(p).check(np.zeros((32, 32), np.float32), ins)


def test_grouped_mx_each_group_its_own_scales():
    groups, rows, n, k = 3, 40, 48, 192
    p = spatialc.build(spatialc.grouped_gemm(groups, rows, n, k, "e4m3", scales="mx"), "sm_89", form="general")
    assert p.tensor_named("scale_a").dtype == DType.E8M0 and p.plans[0].block.ibw == 2
    rng = np.random.default_rng(3)
    fmt = FORMATS["e4m3"]
    ins = {
        "A": rng.normal(size=(groups, rows, k)).astype(fmt),
        "B": rng.normal(size=(groups, k, n)).astype(fmt),
        "sizes": np.array([40, 0, 17], np.int32),
        "scale_a": np.exp2(rng.integers(-4, 5, (groups, rows, k // 32))).astype(E8M0),
        "scale_b": np.exp2(rng.integers(-4, 5, (groups, k // 32, n))).astype(E8M0),
    }
    c = spatialc.evaluate(p, ins)
    assert np.array_equal(c, reference(p, ins))
    for g in range(groups):
        one = {x: ins[x][g] for x in ("A", "B", "scale_a", "scale_b")}
        want = naive(p, one, step=32)
        want[int(ins["sizes"][g]) :] = 0
        assert np.array_equal(c[g], want.astype(np.float32))


def test_the_sm90a_form_refuses_mx_by_one_line_naming_the_forms_auto_picks():
    p = scaled(128, 128, 256, scales="mx", target="sm_90a", form="general")
    with pytest.raises(SpatialError) as e:
        spatialc.lower(p, form="sm90a")
    text = str(e.value)
    assert "\n" not in text and "MXFP8" in text and "form='general'" in text
    assert "auto prints it in the persistent form (spatialc.lower(p), or form='persistent')" in text
    art = spatialc.lower(scaled(128, 128, 256, scales="mx", target="sm_90a"))  # auto: an mma.sync form prints it
    assert art.budget.form == "persistent"


def test_cli_scales_mx(capsys):
    assert main(["gemm", "48", "40", "96", "--precision", "e4m3", "--scales", "mx", "--target", "sm_89"]) == 0
    out = capsys.readouterr().out
    assert "scales mx" in out and "promoted every 32 of K" in out and "OK" in out
    args = ["gemm", "48", "40", "96", "--precision", "e4m3", "--scales", "mx"]
    assert main([*args, "--target", "sm_90a", "--form", "sm90a"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "MXFP8" in err and "persistent form" in err and "general form" in err


def test_an_mx_program_round_trips_through_json_unchanged():
    """No field of its own (docs/json.md): e8m0 scale tensors and groups of 32 in a version-11 document."""
    p = scaled(40, 72, 200, scales="mx")
    text = spatialc.to_json(p)
    assert f'"version": {serde.VERSION}' in text  # (the version-11 format, unchanged since)
    back = spatialc.from_json(text)
    assert back == p and is_mx(back) and promotion_k(back) == 32


def test_spatialc_lang_refuses_an_mx_program_by_one_line_as_any_block_scaled_one():
    from spatialc.lang.source import python_source

    with pytest.raises(SpatialError, match=r"a block-scaled matmul \(spatialc.gemm's scales=\) has no form in"):
        python_source(scaled(32, 32, 64, scales="mx"))


def test_scale_codes_whose_products_leave_float32_are_said():
    """Codes 254 and 254 (sa · sb = 2^254) on ones: C itself is past float32, so the kernel's float32 sum overflows
    where the float64 reference does not — the range check says so (strict: refused), as for any kernel; the same
    inputs at codes 254 and 0 (2^0) are in range."""
    p = scaled(32, 32, 64, scales="mx")
    ins = {"A": np.ones((32, 64)).astype(FORMATS["e4m3"]), "B": np.ones((64, 32)).astype(FORMATS["e4m3"])}
    ins |= {"scale_a": np.full((32, 2), 2.0**127).astype(E8M0), "scale_b": np.full((2, 32), 2.0**127).astype(E8M0)}
    tol = spatialc.tolerance(p, kernel=True, strict=True)
    with pytest.raises(InputError, match=r"at or past float32's largest value"):
        tol.check(np.zeros((32, 32), np.float32), ins)
    ins["scale_b"] = np.full((2, 32), 2.0**-127).astype(E8M0)
    c = spatialc.evaluate(p, ins)
    assert np.all(c == 64.0 * 2.0**-127 * 2.0**127) and tol.check(c, ins)[0]
