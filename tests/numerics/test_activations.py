"""Activation epilogues (gelu, silu, sigmoid, tanh): refused where they cannot run, the interpreter against an
independent float64 reference, and the general form's kernel under the emulation within the stated tolerance."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import warnings

import numpy as np
import pytest

import spatialc
from spatialc.cli import main
from spatialc.errors import ProgramError
from spatialc.ir.ops import ACTIVATIONS, Activation, Relu
from spatialc.lower.errors import NeedsGeneral

from ..rewrite import swap_compute

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

# Written out with math, one element at a time: no numpy, no shared code with spatialc.numerics.epilogue.
INDEPENDENT = {
    "gelu": lambda x: 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "gelu_erf": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
    "silu": lambda x: x / (1.0 + math.exp(-x)) if x > -700 else -0.0 * x,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0,
    "tanh": math.tanh,
}


def program(name: str, prec: str = "fp16", **build):
    with pytest.warns(FutureWarning) if name == "gelu" else contextlib.nullcontext():  # bare gelu: said below
        chain = [spatialc.bias(), spatialc.activation(name), spatialc.scalar("mul", 2)]
    return spatialc.build(spatialc.gemm(40, 48, 64, prec, epilogue=chain), "sm_86", **build)


def integer_inputs(seed: int) -> dict[str, np.ndarray]:
    """Integer-valued operands (every fp32 sum exact, so the matmul is exact everywhere) and a real bias."""
    rng = np.random.default_rng(seed)
    return {
        "A": rng.integers(-3, 4, (40, 64)).astype(np.float64),
        "B": rng.integers(-2, 3, (64, 48)).astype(np.float64),
        "bias": rng.normal(scale=4.0, size=(1, 48)).astype(np.float32),
    }


def test_unknown_and_integer_activations_are_refused_by_name():
    with pytest.raises(ProgramError, match="unknown activation 'relu6'; use one of gelu, gelu_tanh, gelu_erf, silu, "):
        spatialc.activation("relu6")
    with pytest.raises(ProgramError, match="activation gelu_tanh is float arithmetic; an int8 program's epilogue"):
        spatialc.gemm(16, 16, 16, "int8", epilogue=[spatialc.activation("gelu_tanh")])


def test_a_hand_edited_activation_in_an_int8_program_is_refused_by_verify():
    p = spatialc.build(spatialc.gemm(32, 32, 32, "int8", epilogue=[spatialc.relu()]), "sm_86")
    broken = swap_compute(p, Relu(), Activation("gelu_tanh"))
    with pytest.raises(spatialc.VerifyError, match="activation gelu_tanh is float arithmetic"):
        spatialc.verify(broken)
    fp16 = spatialc.build(spatialc.gemm(32, 32, 32, "fp16", epilogue=[spatialc.relu()]), "sm_86")
    unknown = swap_compute(fp16, Relu(), Activation("swish"))
    with pytest.raises(spatialc.VerifyError, match="elementwise op 'swish' is none of the table's"):
        spatialc.verify(unknown)


def test_an_activation_program_round_trips_through_json():
    p = program("silu")
    back = spatialc.from_json(spatialc.to_json(p))
    stages = [s.kind.op for s in back.stages if getattr(s.kind, "op", None) == Activation("silu")]
    assert back == p and p.name.endswith("_bias_silu_scalar") and len(stages) == 1


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_the_interpreter_equals_an_independent_float64_formula(name):
    p = program(name)
    x = integer_inputs(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        c = spatialc.evaluate(p, x)
    pre = (x["A"] @ x["B"]).astype(np.float32) + x["bias"]  # exact products, float32 bias add, as declared
    want = np.vectorize(lambda v: np.float32(INDEPENDENT[name](float(v))))(pre).astype(np.float32) * np.float32(2)
    # The formula, in float64, rounded once: equal but where math's tanh / exp and numpy's differ in the last
    # float64 ulp across a float32 rounding boundary, or in gelu's cancelling tail (2^-50·|x|).
    bound = np.spacing(np.abs(want)) + 2.0**-49 * np.abs(pre)
    assert (np.abs(c.astype(np.float64) - want) <= bound).all()
    assert np.mean(c == want) > 0.95 and len(np.unique(c)) > 100


@pytest.mark.parametrize("prec", ["fp16", "bf16"])
def test_an_activation_is_printed_by_the_general_form_only(prec):
    p = program("gelu", prec)
    with pytest.raises(NeedsGeneral, match="a gelu_tanh stage"):
        spatialc.lower(p, form="persistent")
    art = spatialc.lower(p)
    assert art.budget.form == "general"
    assert "const float v = spatialc_gelu_tanh(v0);" in art.kernel_cu and "__dadd_rn" in art.kernel_cu
    want = {"Map_gelu_tanh_x0": 1, "Map_add_x0_col": 1, "MatmulTiles": 1, "Map_mul_x0_lit": 1}
    assert art.census.printed_stages == want


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_auto_plans_an_activation_for_the_general_form_whose_rings_it_must_hold(target):
    # Planned for the persistent kernel (which cannot print it), the general form's output and epilogue rings would
    # need 360 KiB of shared memory; auto plans for a form that prints it, counting them (on sm_90a, its own form).
    g = spatialc.gemm(1024, 2048, 256, "bf16", epilogue=[spatialc.activation("gelu_tanh")])
    art = spatialc.lower(spatialc.build(g, target))
    assert art.budget.form == ("sm90a" if target == "sm_90a" else "general")
    assert art.budget.total_bytes <= spatialc.target(target).smem_per_site_max
    small = spatialc.lower(
        spatialc.build(spatialc.gemm(512, 512, 256, "bf16", epilogue=[spatialc.activation("gelu_tanh")]), target)
    )
    assert small.budget.form == ("sm90a" if target == "sm_90a" else "general")  # where its own plan fits, sm_90a


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_the_kernel_is_within_the_stated_tolerance_of_the_interpreter(name):
    p = program(name, block=(2, 4, 1), sites=2)
    x = integer_inputs(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        ref = spatialc.evaluate(p, x)
        c = spatialc.emulate(spatialc.lower(p), x, mode="late")
        ok, text = spatialc.tolerance(p, kernel=True).check(c, x)
    assert ok, text
    pre = np.abs((x["A"] @ x["B"]) + x["bias"])
    assert (np.abs(c.astype(np.float64) - ref) <= 2 * np.spacing(np.abs(ref)) + 2.0**-48 * pre).all()
    assert np.mean(c == ref) > 0.95


@emulation
@pytest.mark.emulation
def test_the_cli_runs_an_activation_epilogue(capsys):
    status = main(["gemm", "40", "48", "64", "--precision", "bf16", "--activation", "tanh", "--run", "--form", "auto"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "general form: each engine on its own warps" in out and "epilogue tanh" in out
    assert main(["gemm", "8", "8", "8", "--activation", "swish"]) == 2
    assert "invalid choice: 'swish'" in capsys.readouterr().err


def test_the_tolerance_allows_gelus_tail_where_a_scalar_constant_makes_x_large():
    """Rows of A that are zero give x = the scalar add's constant exactly, in gelu's cancelling tail: there a float64
    ulp of tanh moves the result by about 2^-50·|x|, which the bound must allow with |A|@|B| = 0."""
    chain = [spatialc.scalar("add", -6.8125), spatialc.activation("gelu_tanh")]
    p = spatialc.build(spatialc.gemm(32, 32, 32, "fp16", epilogue=chain), "sm_86")
    x = {"A": np.zeros((32, 32)), "B": np.ones((32, 32))}
    ref = spatialc.evaluate(p, x)
    off_by_tail = ref.astype(np.float64) * (1 + 2.0**-6)  # 1.6 % of a value near -2e-14: 3e-16, under 2^-50·6.8
    ok, text = spatialc.tolerance(p, kernel=True).check(off_by_tail, x)
    assert ok, text
    assert not spatialc.tolerance(p, kernel=True).check(ref.astype(np.float64) + 1e-12, x)[0]


def test_equal_infinities_and_nans_are_within_the_tolerance():
    chain = [spatialc.scalar("mul", 1e38), spatialc.activation("gelu_tanh")]
    p = spatialc.build(spatialc.gemm(16, 16, 16, "fp16", epilogue=chain), "sm_86")
    x = {"A": np.eye(16) * np.where(np.arange(16) % 2, 1.0, -1.0)[:, None] * 8, "B": np.ones((16, 16))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = spatialc.evaluate(p, x)
        assert np.isinf(ref).any() and np.isnan(ref).any()
        assert spatialc.tolerance(p).check(ref, x)[0]
        assert not spatialc.tolerance(p).check(np.where(np.isnan(ref), 1.0, ref), x)[0]


def test_gelu_names_each_form_and_gelu_alone_keeps_the_tanh_form_saved_programs_have():
    """`gelu` is the tanh form it always was (programs saved with it mean that); `gelu_tanh` and `gelu_erf` ask for
    each form by name — the erf one the table's gelu, nn.GELU()'s default — and the CLI takes all three."""
    bare = program("gelu")  # the tanh form, with a warning (below)
    ops_of = {name: next(s.kind.op.expr.op for s in p.stages if "gelu" in s.name) for name, p in
              (("gelu", bare), ("gelu_tanh", program("gelu_tanh")), ("gelu_erf", program("gelu_erf")))}  # fmt: skip
    assert ops_of == {"gelu": "gelu_tanh", "gelu_tanh": "gelu_tanh", "gelu_erf": "gelu"}
    x = integer_inputs(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        erf, tanh = (spatialc.evaluate(program(n), x) for n in ("gelu_erf", "gelu_tanh"))
    assert not np.array_equal(erf, tanh)  # the two forms differ, and each name gives its own
    assert main(["gemm", "40", "48", "64", "--precision", "bf16", "--activation", "gelu_erf", "--check", "none"]) == 0


def test_bare_gelu_asked_of_an_epilogue_warns_naming_both_forms():
    """Bare gelu is the tanh form in an epilogue but the erf form in the table and torch: code asking an epilogue for
    it (spatialc.activation, the language's Activation) is told, by a FutureWarning at its own line, to name one."""
    says = r"activation 'gelu' is the tanh form .* name it 'gelu_tanh' \(the same result\) or 'gelu_erf' \(torch's"
    for make in (spatialc.activation, Activation):
        with pytest.warns(FutureWarning, match=says) as caught:
            assert make("gelu") == make("gelu_tanh")
        assert [w.filename for w in caught] == [__file__]  # the warning points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh"):
            spatialc.activation(name), Activation(name)


def test_the_cli_notes_bare_gelu_once_on_stderr_and_runs_it_as_gelu_tanh(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        argv = ["gemm", "40", "48", "64", "--precision", "bf16", "--check", "none"]
        assert main([*argv, "--activation", "gelu", "--activation", "gelu"]) == 0
        bare = capsys.readouterr()
        assert main([*argv, "--activation", "gelu_tanh", "--activation", "gelu_tanh"]) == 0
        named = capsys.readouterr()
    notes = [line for line in bare.err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "'gelu_tanh' (the same result) or 'gelu_erf'" in notes[0], bare.err
    timeless = [[line for line in run.out.splitlines() if " ms" not in line] for run in (bare, named)]
    assert timeless[0] == timeless[1] and "note:" not in named.err  # the same program, said the same way


def test_a_saved_program_with_bare_gelu_reads_silently_as_the_gelu_tanh_it_meant():
    """A version-6 document names the activation `{"type": "Activation", "name": "gelu"}`: it reads with no warning
    (the user wrote nothing) as the gelu_tanh program, which the interpreter evaluates the same."""
    p = program("gelu_tanh")
    doc = json.loads(spatialc.to_json(p))
    gelu_tanh = {"type": "Map", "expr": {"type": "Apply", "op": "gelu_tanh", "args": [{"type": "Arg", "index": 0}],
                 "params": []}}  # fmt: skip
    text = json.dumps({**doc, "version": 6})
    assert json.dumps(gelu_tanh) in text  # the stage's op and its engine's computes, each written as version 6 did
    text = text.replace(json.dumps(gelu_tanh), json.dumps({"type": "Activation", "name": "gelu"}))
    assert '"gelu_tanh"' not in text
    x = integer_inputs(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", spatialc.InexactInputWarning)
        back = spatialc.from_json(text)
        assert back == p
        assert np.array_equal(spatialc.evaluate(back, x), spatialc.evaluate(p, x))
