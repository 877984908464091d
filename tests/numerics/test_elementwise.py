"""The elementwise table walked op by op: each entry's meaning against a formula written here with `math` alone, the
interpreter's value, the integer ranges and float error bounds verify and the tolerance compose, and the C every
printer prints — compiled with g++ exactly as the host emulation compiles a kernel, and run on the same values."""

from __future__ import annotations

import itertools
import math
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from spatialc.ir.ops import Apply, Arg, Col, Lit, TensorId
from spatialc.numerics import cexpr, intervals
from spatialc.numerics import elementwise as E

# Each op's meaning, one value at a time, in float64 with math (no numpy, nothing shared with the table).
INDEPENDENT = {
    "neg": lambda x: -x,
    "abs": lambda x: abs(x),
    "exp": lambda x: math.exp(x) if x < 709 else math.inf,
    "exp2": lambda x: 2.0**x if x < 1024 else math.inf,
    "log": lambda x: math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan),
    "log2": lambda x: math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan),
    "sqrt": lambda x: math.sqrt(x) if x >= 0 else math.nan,
    "rsqrt": lambda x: 1.0 / math.sqrt(x) if x > 0 else (math.inf if x == 0 else math.nan),
    "recip": lambda x: 1.0 / x if x != 0 else math.copysign(math.inf, x),
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)) if x > -709 else 0.0,
    "tanh": lambda x: math.tanh(x),
    "gelu": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1.0 + math.exp(-x)) if x > -709 else -0.0,
    "relu": lambda x: x if x > 0 else 0.0,
    "leaky_relu": lambda x, a: x if x > 0 else a * x,
    "clamp": lambda x, lo, hi: min(max(x, lo), hi),
    "square": lambda x: x * x,
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y if y != 0 else (math.nan if x == 0 else math.copysign(math.inf, x) * math.copysign(1, y)),
    "max": lambda x, y: max(x, y),
    "min": lambda x, y: min(x, y),
    "pow": lambda x, y: x**y if x > 0 else math.nan,
    "lt": lambda x, y: float(x < y),
    "le": lambda x, y: float(x <= y),
    "gt": lambda x, y: float(x > y),
    "ge": lambda x, y: float(x >= y),
    "eq": lambda x, y: float(x == y),
    "ne": lambda x, y: float(x != y),
    "where": lambda c, x, y: x if c != 0 else y,
    "mask": lambda c, x: x if c != 0 else -math.inf,
}
PARAMS = {"leaky_relu": (0.01,), "clamp": (-1.5, 2.25)}
# The operand values each op is tried on: a domain where its meaning is finite (and a few edges it owns).
SAMPLES = np.array([-7.25, -3.0, -1.0, -0.75, -0.5, -1e-3, 0.0, 1e-3, 0.3, 0.5, 1.0, 1.5, 2.0, 3.5, 9.0], np.float32)
POSITIVE = ("log", "log2", "sqrt", "rsqrt", "pow")


def test_the_table_holds_the_ops_the_issue_names_and_every_independent_formula():
    named = [
        *("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "recip", "sigmoid", "tanh", "gelu"),
        *("gelu_tanh", "silu", "relu", "leaky_relu", "clamp", "square", "add", "sub", "mul", "div", "max"),
        *("min", "pow", "where", "lt", "le", "gt", "ge", "eq", "ne"),
    ]
    assert set(named) <= set(E.OPS) and set(E.OPS) == set(INDEPENDENT)
    for op in E.OPS.values():
        assert op.arity == INDEPENDENT[op.name].__code__.co_argcount - len(op.params), op.name


def operands(op: E.ElementwiseOp) -> list[np.ndarray]:
    """Every combination of sample operands for `op` (a condition first for where)."""
    values = np.abs(SAMPLES) + np.float32(0.125) if op.name in POSITIVE else SAMPLES
    grids = np.meshgrid(*([values] * op.arity), indexing="ij")
    return [g.reshape(-1) for g in grids]


@pytest.mark.parametrize("name", sorted(INDEPENDENT))
def test_each_ops_meaning_is_its_formula_and_the_interpreter_rounds_it_once(name):
    op = E.OPS[name]
    xs, params = operands(op), PARAMS.get(name, ())
    expr = Apply(name, tuple(Arg(i) for i in range(op.arity)), params)
    got = E.evaluate(expr, xs, integer=False)
    for i in range(got.size):
        args = [float(x[i]) for x in xs]
        want = INDEPENDENT[name](*args, *params)
        exact = float(np.asarray(op.f64(*(np.float64(a) for a in args), *params)))
        # One float64 ulp apart at most, or the tail where the formula cancels (gelu's 1 + erf, 1 + tanh).
        slack = E.GELU_TAIL * max(abs(a) for a in args) if op.tail else 1e-300
        assert exact == pytest.approx(want, rel=4e-16, abs=slack, nan_ok=True), (name, args)
        assert got.dtype == np.float32
        assert np.float32(exact) == got[i] or (math.isnan(exact) and math.isnan(got[i])), (name, args)


@pytest.mark.parametrize("name", sorted(n for n, op in E.OPS.items() if op.integer))
def test_each_integer_op_is_exact_and_within_the_range_verify_states(name):
    op = E.OPS[name]
    rng = np.random.default_rng(1)
    xs = [rng.integers(-1000, 1000, 400) for _ in range(op.arity)]
    params = {"clamp": (-50.0, 70.0)}.get(name, PARAMS.get(name, ()))
    expr = Apply(name, tuple(Arg(i) for i in range(op.arity)), params)
    got = E.evaluate(expr, xs, integer=True)
    want = [int(INDEPENDENT[name](*(int(x[i]) for x in xs), *params)) for i in range(400)]
    assert got.dtype == np.int64 and got.tolist() == want
    lo, hi = intervals.int_range(expr, [(-1000, 999)] * op.arity, lambda c: (0, 0))
    assert lo <= min(want) and max(want) <= hi
    # The range is tight: operands within their ranges reach both of its ends.
    grid = np.meshgrid(*([np.array([-1000, -1, 0, 1, 999])] * op.arity), indexing="ij")
    reached = [int(INDEPENDENT[name](*(int(g.flat[i]) for g in grid), *params)) for i in range(grid[0].size)]
    assert (min(reached), max(reached)) == (lo, hi), (lo, hi)


def test_an_integer_value_past_exact_int64_is_refused():
    big = np.array([2**61], np.int64)
    with pytest.raises(E.ElementwiseError, match="beyond ±2\\^62"):
        E.evaluate(Apply("mul", (Arg(0), Lit(4.0))), [big], integer=True)
    with pytest.raises(E.ElementwiseError, match="float arithmetic"):
        E.evaluate(Apply("exp", (Arg(0),)), [big], integer=True)


@pytest.mark.parametrize("name", sorted(n for n, op in E.OPS.items() if not op.comparison and n != "where"))
def test_the_error_bound_holds_for_operands_anywhere_in_their_boxes(name):
    # The interval bound: wherever the exact operands lie within their errors, the op's exact value lies within
    # the bound of the value computed from the given operands.
    op = E.OPS[name]
    rng = np.random.default_rng(2)
    base = [np.abs(x) + 0.125 if name in POSITIVE else x for x in (rng.normal(0, 2, 300) for _ in range(op.arity))]
    err = [np.abs(rng.normal(0, 1e-3, 300)) for _ in range(op.arity)]
    params = PARAMS.get(name, ())
    expr = Apply(name, tuple(Arg(i) for i in range(op.arity)), params)
    y, bound = intervals.bounded(expr, list(zip(base, err, strict=True)))
    for _ in range(20):
        moved = [x + e * rng.uniform(-1, 1, 300) for x, e in zip(base, err, strict=True)]
        exact = np.asarray(op.f64(*moved, *params), np.float64)
        finite = np.isfinite(exact) & np.isfinite(bound)
        assert (np.abs(exact - y)[finite] <= bound[finite]).all(), name


def test_each_turning_point_is_where_its_op_turns():
    # gelu_tanh's was -0.7522295055, 2.3e-4 from its least value (at -0.75246142…): the interval bound of a box
    # holding the minimum stopped 1.2e-8 above it.
    for name, op in E.OPS.items():
        params = {"leaky_relu": (-0.5,)}.get(name, PARAMS.get(name, ()))  # with α < 0 it turns at 0
        for t in op.turns:
            left, at, right = np.asarray(op.f64(np.array([t - 1e-5, t, t + 1e-5]), *params), np.float64)
            assert at <= min(left, right) or at >= max(left, right), (name, t)
    lo, _ = intervals.image(E.OPS["gelu_tanh"], [(np.array([-0.76]), np.array([-0.74]))], (), integer=False)
    assert lo[0] <= E.OPS["gelu_tanh"].f64(np.array([-0.7524614220710163]))[0]


def test_a_pole_or_an_undecided_comparison_is_bounded_honestly():
    x = np.array([1.0, 0.01]), np.array([1e-3, 0.1])  # the second box holds 0
    _, e = intervals.bounded(Apply("recip", (Arg(0),)), [x])
    assert np.isfinite(e[0]) and e[1] == np.inf
    base, power = (np.array([-3.0, -3.0]), np.zeros(2)), (np.array([2.0, 2.5]), np.array([0.0, 0.5]))
    _, e = intervals.bounded(Apply("pow", (Arg(0), Arg(1))), [base, power])
    assert np.isfinite(e[0]) and e[1] == np.inf  # (-3)^2 is bounded; (-3)^y over y in [2, 3] is NaN inside
    x = np.array([1.0, 0.45]), np.array([1e-3, 0.1])  # the second box holds 0.5
    _, e = intervals.bounded(Apply("lt", (Arg(0), Lit(0.5))), [x])
    assert e.tolist() == [0.0, 1.0]  # decided where the box lies wholly past 0.5, either value where it straddles


# ---- the C every printer prints, compiled and run ------------------------------------------------------------

HARNESS = """
#include <cstdio>
#include <cstring>
#include <cmath>
#define __device__
#define __forceinline__ inline
{header}
static float bits(unsigned u) {{ float f; std::memcpy(&f, &u, 4); return f; }}
static unsigned out(float f) {{ unsigned u; std::memcpy(&u, &f, 4); return u; }}
int main() {{
{body}
    return 0;
}}
"""


@pytest.mark.emulation
def test_the_printed_c_of_every_op_computes_the_interpreters_values(tmp_path):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    header = (Path(E.__file__).parent.parent / "lower" / "cuda" / "common" / "elementwise.cuh").read_text()
    lines, cases = [], []
    for name, op in sorted(E.OPS.items()):
        xs, params = operands(op), PARAMS.get(name, ())
        expr = Apply(name, tuple(Arg(i) for i in range(op.arity)), params)
        for i in range(xs[0].size):
            args = [np.float32(x[i]) for x in xs]
            page = {j: f"bits({struct.unpack('<I', struct.pack('<f', a))[0]}u)" for j, a in enumerate(args)}
            lines.append(f'    printf("%u\\n", out({cexpr.c_expr(expr, False, page.__getitem__, str)}));')
            cases.append((name, op, args, params))
    for name, op in sorted(E.OPS.items()):
        if op.c_int is None:
            continue
        params = {"clamp": (-50.0, 70.0)}.get(name, PARAMS.get(name, ()))
        expr = Apply(name, tuple(Arg(i) for i in range(op.arity)), params)
        for args in ((-7, 3, 5), (0, -2, 9), (12, 12, -1), (-3, -8, 0)):
            page = {j: f"(long long)({a})" for j, a in enumerate(args[: op.arity])}
            lines.append(f'    printf("%lld\\n", (long long){cexpr.c_expr(expr, True, page.__getitem__, str)});')
            cases.append((name, None, list(args[: op.arity]), params))
    src = HARNESS.format(header=header, body="\n".join(lines))
    exe = tmp_path / "ops"
    subprocess.run(
        [cxx, "-std=c++20", "-O2", "-ffp-contract=off", "-x", "c++", "-", "-o", str(exe)],
        input=src,
        text=True,
        check=True,
    )
    printed = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert len(printed) == len(cases)
    for text, (name, op, args, params) in zip(printed, cases, strict=True):
        expr = Apply(name, tuple(Arg(i) for i in range(len(args))), params)
        if op is None:  # an integer op
            want = int(E.evaluate(expr, [np.array([a]) for a in args], integer=True)[0])
            assert int(text) == want, (name, args)
            continue
        c = np.float32(struct.unpack("<f", struct.pack("<I", int(text)))[0])
        want = E.evaluate(expr, [np.array([a], np.float32) for a in args], integer=False)[0]
        if math.isnan(want):
            assert math.isnan(c), (name, args)
        elif op.ulps == 0:
            assert c == want, (name, args, c, want)  # the same rounding of the same value
        else:
            assert abs(float(c) - float(want)) <= op.ulps * float(np.spacing(np.abs(want))), (name, args, c, want)


@pytest.mark.emulation
def test_the_printed_c_of_the_exact_ops_keeps_the_interpreters_signed_zeros(tmp_path):
    # The test above compares values, and −0 == +0: here every bit counts. clamp(−0, 0, 1) printed −0 where numpy's
    # minimum(maximum(x, lo), hi) gives +0, and a recip after it gave −inf in the kernel, +inf in the interpreter.
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++")
    header = (Path(E.__file__).parent.parent / "lower" / "cuda" / "common" / "elementwise.cuh").read_text()
    values = [np.float32(v) for v in (-0.0, 0.0, -1.0, 1.0)]
    params = {"clamp": [(0.0, 0.0), (-0.0, 0.0), (0.0, 1.0), (-1.0, -0.0), (-0.0, -0.0)]}
    params["leaky_relu"] = [(0.0,), (-0.0,), (-1.0,)]
    lines, cases = [], []
    for name, op in sorted(E.OPS.items()):
        if op.ulps or op.transcendental:
            continue
        for ps in params.get(name, [()]):
            expr = Apply(name, tuple(Arg(i) for i in range(op.arity)), ps)
            for args in itertools.product(values, repeat=op.arity):
                page = {j: f"bits({struct.unpack('<I', struct.pack('<f', a))[0]}u)" for j, a in enumerate(args)}
                lines.append(f'    printf("%u\\n", out({cexpr.c_expr(expr, False, page.__getitem__, str)}));')
                cases.append((expr, args))
    src = HARNESS.format(header=header, body="\n".join(lines))
    exe = tmp_path / "zeros"
    subprocess.run(
        [cxx, "-std=c++20", "-O2", "-ffp-contract=off", "-x", "c++", "-", "-o", str(exe)],
        input=src,
        text=True,
        check=True,
    )
    printed = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert len(printed) == len(cases)
    for text, (expr, args) in zip(printed, cases, strict=True):
        want = E.evaluate(expr, [np.array([a], np.float32) for a in args], integer=False)[0]
        got = np.frombuffer(struct.pack("<I", int(text)), np.float32)[0]
        if math.isnan(want):  # a NaN's sign and payload mean nothing
            assert math.isnan(got), (expr, args)
            continue
        assert int(text) == struct.unpack("<I", struct.pack("<f", want))[0], (expr, args, got, want)


def test_column_vectors_and_constants_print_as_the_printers_need():
    expr = Apply("clamp", (Apply("add", (Arg(0), Col(TensorId(3)))),), (-1.0, 1.0))
    assert cexpr.c_expr(expr, False, lambda i: "v", lambda c: "t3[k]") == (
        "spatialc_clamp(spatialc_fadd(v, t3[k]), (-0x1.0000000000000p+0), (0x1.0000000000000p+0))"
    )
    assert cexpr.c_expr(Apply("mul", (Arg(0), Lit(-3.0))), True, lambda i: "v", str) == "(v * (-3LL))"


def test_the_numerics_doc_lists_every_op_of_the_table():
    doc = (Path(__file__).parents[2] / "docs" / "numerics.md").read_text()
    table = doc[doc.index("## The elementwise ops") :]
    for name in E.OPS:
        assert f"`{name}`" in table or f"`{name}(" in table, name
