"""The fused epilogue of the persistent kernel (issue 6): bias, relu, scalar and requant applied as each warp reads
its accumulators back, checked four ways — the printed text (census, types, refusals), nvcc for sm_80/86/90 with
warnings as errors and no spills, the host emulation against the numpy reference (exactly for int8 chains; for
float chains exactly on whole-number operands, whose float32 accumulation is exact, and within a stated tolerance
on random ones), and planted faults the emulation must catch.

Every chain runs on one of a few shapes, rotated so that each shape and each precision meets many chains: the
matrix of chains × precisions × shapes is covered by its rows, at a price the 2-core CI can pay.
"""

import dataclasses
import itertools
import re
import shutil
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import pytest

import spatialc
from spatialc.errors import SemanticError
from spatialc.frontend import bias, relu, requant, scalar, stage_name
from spatialc.ir.nodes import ComputeStage
from spatialc.ir.ops import Apply, Arg, Map, Requant
from spatialc.lower.artifact import operand_files
from spatialc.lower.census import census, count_printed, stage_kind
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.cuda.common.epilogue import helpers
from spatialc.lower.cuda.persistent.kernel import lower, printed_site_programs
from spatialc.lower.errors import NeedsGeneral, TooBig, Unsupported, UnsupportedPrecision
from spatialc.numerics.quant import quantize_multiplier, requantize
from spatialc.numerics.reference import epilogue_ops, reference
from spatialc.runtime.emulate import emulate

from .test_lower_nvcc import FLAGS, NVCC, gencode, in_namespace, ptxas_entries

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not installed")

# (m, n, k, target, build options): odd sizes (zero padding, a bias padded to whole blocks), several items per site
# (the ITEM loop; item_x > 0, so the bias is read at an offset), sub-blocks (a page two blocks wide), 4 and 8 warps.
SHAPES = {
    "odd_sm86": (50, 40, 40, "sm_86", {"block": (2, 4, 2)}),
    "items_round_robin_sm80": (40, 136, 32, "sm_80", {"block": (2, 4, 1), "sites": 2, "placement": "round_robin"}),
    "sub_blocks_sm90": (36, 160, 48, "sm_90", {"block": (2, 4, 1), "sub_blocks": (1, 2), "depth": 1}),
}
SCALARS = {
    "int8": (("add", 7), ("mul", -3), ("max", -90), ("min", 5000)),
    "fp16": (("add", 1.25), ("mul", 0.3), ("max", -2.5), ("min", 40.0)),
}
SCALARS["bf16"] = SCALARS["fp16"]
REQUANTS = ((0.0005, 3), (0.01, -7), (1.5, 0))  # a right shift, another, and a left shift (scale > 1)


def chains(prec):
    """Every subset of {bias, relu, scalar} in that order, then again with requant last (int8): 16 or 8 chains; a
    few other orders (a multiply before the bias is where a fused multiply-add would round differently)."""
    out = []
    for i, (b, r, s) in enumerate(itertools.product((0, 1), repeat=3)):
        op, value = SCALARS[prec][i // 2 % 4]  # the four chains with a scalar take add, mul, max and min
        chain = [bias()] * b + [relu()] * r + [scalar(op, value)] * s
        out.append(chain)
        if prec == "int8":
            out.append([*chain, requant(*REQUANTS[i % 3])])
    out.append([scalar("mul", SCALARS[prec][1][1]), bias(), scalar("min", SCALARS[prec][3][1])])
    out.append([relu(), bias()] + ([requant(0.002, -5)] if prec == "int8" else []))
    return out


def label(chain):
    return "+".join(stage_name(s) for s in chain) or "none"


# (case name, precision, shape, chain) for every chain, each on a shape in turn.
CASES = [
    (f"{prec}/{label(chain)}/{shape}", prec, shape, chain)
    for prec in ("int8", "fp16", "bf16")
    for i, chain in enumerate(chains(prec))
    for shape in [list(SHAPES)[(i + len(prec)) % len(SHAPES)]]
]
assert len({c[0] for c in CASES}) == len(CASES)


@cache
def built(name):
    _, prec, shape, chain = next(c for c in CASES if c[0] == name)
    m, n, k, tgt, kw = SHAPES[shape]
    return spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=chain), tgt, **kw)


@cache
def lowered(name):
    p = built(name)
    return lower(p, spatialc.target(p.target))


def inputs(p, seed=0, whole=True, big_bias=False):
    """A, B (and each bias) for `p`: whole numbers by default (exact in every operand type and in the float32
    accumulation); with `big_bias`, int8 biases near the int32 limits, so the epilogue's sums leave int32."""
    rng = np.random.default_rng(seed)
    a_t, b_t = p.tensor_named("A"), p.tensor_named("B")
    integer = p.precision.value == "int8"
    if integer:
        a, b = rng.integers(-128, 128, a_t.elems), rng.integers(-128, 128, b_t.elems)
    elif whole:
        a, b = rng.integers(-8, 9, a_t.elems), rng.integers(-8, 9, b_t.elems)
    else:
        a, b = rng.standard_normal(a_t.elems), rng.standard_normal(b_t.elems)
    out = {"A": a, "B": b}
    for t in p.tensors:
        if t.role.value == "parameter":
            # Distinct in every column: a bias read from the wrong column or row cannot go unnoticed.
            if not integer:
                out[t.name] = rng.standard_normal(t.elems).astype(np.float32) * 8
            elif big_bias:
                out[t.name] = rng.choice([-1, 1], t.elems) * (2**31 - 1 - rng.integers(0, 5000, t.elems))
            else:
                out[t.name] = rng.integers(-40000, 40000, t.elems)
    return out


# ---- the printed text ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_the_census_counts_each_epilogue_stage_once_and_the_output_type_follows_the_last(name):
    p, a = built(name), lowered(name)
    _, prec, _, chain = next(c for c in CASES if c[0] == name)
    assert a.census.agrees
    assert a.census.program["Compute"] == a.census.printed["Compute"] == 1 + len(chain)
    kinds = [stage_kind(op) for op in epilogue_ops(p)]
    assert a.census.stages == a.census.printed_stages == dict(Counter(["MatmulTiles", *kinds]))
    # Each stage's one statement sits in the read-out loop, in chain order, with its own marker.
    loop = a.kernel_cu[a.kernel_cu.index("for (int j = 0; j < 2; ++j)") :]  # the loop over a pair of elements
    loop = loop[: loop.index("}")]
    assert count_printed(loop) == ({"Compute": len(chain)} if chain else {})
    # The fused rings are gone: only the two operand rings are left.
    assert sorted(set(re.findall(r"SPATIALC_SHARED_RING\(\w+, (ring_\d+)", a.kernel_cu))) == ["ring_0", "ring_1"]
    int8_out = "long long" if chain else "int"  # an epilogue computes in int64; a bare int8 GEMM stores its int32 sums
    out = "signed char" if chain and isinstance(chain[-1], Requant) else int8_out if prec == "int8" else "float"
    assert f"typedef {out} OUT_T;" in a.kernel_cu
    biases = [t for t in p.tensors if t.role.value == "parameter"]
    opt = {"int8": "signed char", "fp16": "__half", "bf16": "__nv_bfloat16"}[prec]
    assert [(q.name, q.c_type, q.role) for q in a.launch.params] == [
        ("A", opt, "input"),
        ("B", opt, "input"),
        ("C", out, "output"),
        *[(t.name, "int" if prec == "int8" else "float", "parameter") for t in biases],
    ]
    files = operand_files([q.role for q in a.launch.params])  # by position: a bias is p3.txt, whatever its name
    for t in biases:
        assert files[int(t.id)] == f"p{int(t.id)}.txt"
        assert f'spatialc_read("p{int(t.id)}.txt", h{int(t.id)})' in a.program_cu
        assert f"spatialc_bench_input(h{int(t.id)}, {int(t.id)});" in a.bench_cu
    assert ("spatialc_requant(v," in a.kernel_cu) == any(isinstance(s, Requant) for s in chain)


def test_the_census_tells_a_stage_applied_twice_from_each_stage_once():
    name = next(c[0] for c in CASES if c[0].startswith("int8/bias+relu/"))
    p, a = built(name), lowered(name)
    wrong = a.kernel_cu.replace("// op:Compute:Map_add_x0_col", "// op:Compute:Map_relu_x0")
    counted = census(printed_site_programs(p), wrong)
    assert counted.program == counted.printed  # as many Computes as ever …
    assert counted.printed_stages == {"MatmulTiles": 1, "Map_relu_x0": 2} and not counted.agrees  # … but the wrong ones


def test_the_bias_is_read_by_the_output_column_of_the_element():
    a = lowered(next(c[0] for c in CASES if c[2] == "sub_blocks_sm90" and c[0].startswith("int8/bias")))
    (line,) = [ln.strip() for ln in a.kernel_cu.splitlines() if "t3[" in ln]
    # Page tile column bw of the item at tile column item_x * 8, then the element's column inside its tile.
    want = "v = (v + (long long)t3[(long long)(item_x * 8 + bw) * 256 + el % 16]);  // op:Compute:Map_add_x0_col"
    assert line == want


def test_an_epilogue_the_fused_store_cannot_take_is_left_to_the_general_form():
    chain = [bias(), relu()]
    one_tile = spatialc.build(spatialc.gemm(32, 32, 32, "int8", epilogue=chain), "sm_86", block=(1, 1, 1))
    with pytest.raises(NeedsGeneral, match=r"the epilogue bias bias\[.*\] → relu: .*no warp grid divides"):
        lower(one_tile, spatialc.target("sm_86"))
    p = spatialc.build(spatialc.gemm(32, 64, 32, "fp16", epilogue=chain), "sm_86", block=(2, 4, 1))
    off_registers = dataclasses.replace(spatialc.target("sm_86"), accumulator_in_registers=False)
    with pytest.raises(NeedsGeneral, match="sm_86 keeps accumulators out of registers") as err:
        lower(p, off_registers)
    assert "the general form prints it" in str(err.value)


def test_a_value_inside_a_stages_formula_is_bounded_as_its_result_is():
    # clamp(x·x·x, −10, 10) lies in −10..10, but with K = 2048 the cube inside it reaches 2^75: the interpreter
    # refuses it at run time, and C's long long wraps (the emulation gave 0 where C is 2^25, whose cube clamps to 10).
    # Verify's rule 8 and the lowering bound every value the formula computes, not only the stage's result.
    cube = Map(Apply("clamp", (Apply("mul", (Apply("mul", (Arg(0), Arg(0))), Arg(0))),), (-10.0, 10.0)))
    with pytest.raises(SemanticError, match=r"within stage map0 \(clamp.*a value can reach 37778931862957161709568"):
        spatialc.build(spatialc.gemm(16, 16, 2048, "int8", epilogue=[cube]), "sm_86", split_k=1)
    clamped = Map(Apply("clamp", (Arg(0),), (-10.0, 10.0)))
    p = spatialc.build(spatialc.gemm(16, 16, 2048, "int8", epilogue=[clamped]), "sm_86", split_k=1)
    forged = p.evolve(
        stages=tuple(dataclasses.replace(s, kind=ComputeStage(cube)) if s.name == "map0" else s for s in p.stages),
        verified=True,
    )
    with pytest.raises(TooBig, match=r"within epilogue stage map0 .* in int64"):
        lower(forged, spatialc.target("sm_86"))


def test_a_formula_whose_c_would_multiply_its_text_is_refused_not_printed():
    # An integer abs prints its operand three times, ({0} < 0 ? -{0} : {0}): abs nested 9 deep (10 nodes, which
    # verify takes) printed 3^9 copies of v, and 40 deep would print 3^40, more than any memory holds.
    def nested(depth, op="abs"):
        expr = Arg(0)
        for _ in range(depth):
            expr = Apply(op, (expr,))
        return Map(expr)

    for prec, op, fits, too_many in (("int8", "abs", 7, 9), ("fp16", "square", 12, 13)):
        p = spatialc.build(spatialc.gemm(32, 64, 32, prec, epilogue=[nested(too_many, op)]), "sm_86", block=(2, 4, 1))
        assert p.verified
        for form in ("persistent", "general"):
            with pytest.raises(Unsupported, match=r"would print \d+ leaves.*split the formula into stages"):
                spatialc.lower(p, form=form)
        p = spatialc.build(spatialc.gemm(32, 64, 32, prec, epilogue=[nested(fits, op)]), "sm_86", block=(2, 4, 1))
        assert spatialc.lower(p).program_cu.count("v = ") >= 1


def test_chains_whose_c_would_differ_from_the_epilogue_semantics_are_refused():
    p = built(next(c[0] for c in CASES if c[0].startswith("int8/bias+scalar")))
    huge = [scalar("mul", 2**30), scalar("mul", 2**30)]
    with pytest.raises(SemanticError, match="after stage scalar1"):  # verify's rule 8 bounds the chain first
        spatialc.build(spatialc.gemm(32, 64, 32, "int8", epilogue=huge), "sm_86", block=(2, 4, 1))
    # The lowering's own bound stays, for a program that reaches it with a forged mark.
    ones = spatialc.build(spatialc.gemm(32, 64, 32, "int8", epilogue=[scalar("mul", 1)] * 2), "sm_86", block=(2, 4, 1))
    scaled = tuple(
        dataclasses.replace(s, kind=ComputeStage(huge[0])) if s.name.startswith("scalar") else s for s in ones.stages
    )
    a_big = ones.evolve(stages=scaled, verified=True)
    with pytest.raises(TooBig, match="after epilogue stage scalar1"):  # 32·2^14 · 2^30 · 2^30 leaves int64
        lower(a_big, spatialc.target("sm_86"))
    out = p.output_tensor()
    wrong = p.evolve(
        tensors=tuple(dataclasses.replace(t, dtype=type(t.dtype)("float32")) if t is out else t for t in p.tensors),
        verified=True,
    )
    with pytest.raises(UnsupportedPrecision, match="holds int64 or int32 values"):
        lower(wrong, spatialc.target(p.target))
    stages = tuple(
        dataclasses.replace(s, kind=type(s.kind)(Requant(2**31, 0, 0))) if s.name.startswith("scalar") else s
        for s in p.stages
    )
    with pytest.raises(Unsupported, match="Q31 multiplier"):
        lower(p.evolve(stages=stages, verified=True), spatialc.target(p.target))


# ---- the device helpers, compiled by g++ as the emulation compiles them ------------------------------------------


@needs_gxx
def test_spatialc_requant_is_bit_identical_to_quant_requantize(tmp_path):
    rng = np.random.default_rng(3)
    xs = np.concatenate(
        [
            rng.integers(-(2**40), 2**40, 400),
            rng.integers(-(2**31), 2**31, 400),
            rng.integers(-70000, 70000, 400),
            np.arange(-300, 300),
            [-(2**31) - 1, -(2**31), 2**31 - 1, 2**31, -(2**62), 2**62, 0],
        ]
    ).astype(np.int64)
    params = [
        (*quantize_multiplier(s), zp)
        for s, zp in ((0.0005, 3), (0.01, -7), (2.5, 0), (0.5, 0), (1.0, 127), (1e-9, -128), (0.3333, 11), (1000.0, 5))
    ]
    params += [(2**31 - 1, -31, 0), (2**30, 30, -1), (0, 0, 4)]
    harness = (
        helpers(True)
        + """
#include <cstdio>
int main() {
    long long m, z; int s, n;
    while (scanf("%lld %d %lld %d", &m, &s, &z, &n) == 4) {
        for (int i = 0; i < n; ++i) { long long x; if (scanf("%lld", &x) != 1) return 1;
                                      printf("%lld\\n", spatialc_requant(x, m, s, z)); }
    }
    return 0;
}
"""
    )
    src, exe = tmp_path / "requant.cpp", tmp_path / "requant"
    src.write_text("#define __device__\n#define __forceinline__ inline\n" + harness)
    subprocess.run([GXX, "-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror", str(src), "-o", str(exe)], check=True)
    feed = "".join(f"{m} {s} {z} {len(xs)}\n" + "\n".join(map(str, xs.tolist())) + "\n" for m, s, z in params)
    got = np.array(
        subprocess.run([str(exe)], input=feed, capture_output=True, text=True, check=True).stdout.split(),
        dtype=np.int64,
    ).reshape(len(params), len(xs))
    for (m, s, z), row in zip(params, got, strict=True):
        assert np.array_equal(row, requantize(xs, m, s, z).astype(np.int64)), (m, s, z)


# ---- nvcc -------------------------------------------------------------------------------------------------------


# One int8 and one float case whose program_cu and bench_cu are compiled too (the hosts read and fill the biases).
HOSTS = (
    next(c[0] for c in CASES if c[0].startswith("int8/bias+relu") and "requant" in c[0]),
    next(c[0] for c in CASES if c[0].startswith("fp16/bias")),
)


def nvcc_unit(arts):
    """Every kernel_cu, and the program_cu and bench_cu of those in HOSTS, in namespaces of their own; `texts` says
    which text each case index is."""
    texts = [(name, "p", a.kernel_cu) for name, a in arts]
    for name, a in arts:
        if name in HOSTS:
            texts += [("host", "p", a.program_cu), ("bench", "b", a.bench_cu)]
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    for i, (_, kind, text) in enumerate(texts):
        parts.append(in_namespace(text, i, kind))
    parts.append("int main() { return 0; }\n")
    return "".join(parts), texts


@pytest.fixture(scope="module")
def nvcc_runs(tmp_path_factory):
    """target → (the cases lowered for it, their texts, nvcc's run): each target's kernels compiled for its own
    architecture, the one they were lowered for (sm_80, sm_86, sm_90: a shape each), one translation unit each. A
    unit that holds a program_cu and bench_cu of HOSTS is compiled in host mode (`-c`: that host code by gcc -Wall
    -Wextra -Werror); a unit of kernel_cu texts alone (no host code but a stub main) device-only (-cubin,
    tests/nvcc_clean.py)."""
    d = tmp_path_factory.mktemp("nvcc_epilogue")
    jobs = {}
    for tgt in sorted({SHAPES[shape][3] for _, _, shape, _ in CASES}):
        arts = [(name, lowered(name)) for name, _, shape, _ in CASES if SHAPES[shape][3] == tgt]
        text, texts = nvcc_unit(arts)
        (d / f"{tgt}.cu").write_text(text)
        mode, out = ("-c", d / f"{tgt}.o") if any(name in HOSTS for name, _ in arts) else ("-cubin", d / f"{tgt}.cubin")
        cmd = [NVCC, mode, "-o", str(out), str(d / f"{tgt}.cu"), *gencode(tgt), *FLAGS]
        jobs[tgt] = (dict(arts), texts, cmd)
    with ThreadPoolExecutor(2) as pool:
        runs = {tgt: pool.submit(subprocess.run, cmd, capture_output=True, text=True, timeout=600)
                for tgt, (_, _, cmd) in jobs.items()}  # fmt: skip
        return {tgt: (arts, texts, runs[tgt].result()) for tgt, (arts, texts, _) in jobs.items()}


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("tgt", ["sm_80", "sm_86", "sm_90"])
def test_every_epilogue_kernel_compiles_for_its_target_without_warnings_or_spills(nvcc_runs, tgt):
    arts, texts, run = nvcc_runs[tgt]
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    assert len(entries) == len(texts) and {arch for _, _, arch, _, _ in entries} == {tgt}
    for case, kind, arch, spill, smem in entries:
        name = texts[case][0]
        assert spill == 0, f"{name} ({kind}, {arch}) spills {spill} bytes"
        if name in arts:
            assert smem == arts[name].budget.static_bytes, f"{name} ({arch}): ptxas {smem} bytes of smem"


# ---- the host emulation -------------------------------------------------------------------------------------------


def emulated(names, mutate=lambda text: text, whole=True, mode="late"):
    """C of each named case through the emulation (2 at once), with its inputs and the numpy reference. Chains
    without a requant get int8 biases near the int32 limits: their sums must leave int32 exactly."""

    def one(name):
        p, a = built(name), lowered(name)
        ins = inputs(p, seed=len(name), whole=whole, big_bias="requant" not in name)
        program = dataclasses.replace(a, program_cu=mutate(a.program_cu))
        return emulate(program, ins, mode=mode), reference(p, ins), ins

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, names))


@pytest.fixture(scope="module")
def runs():
    """Every case through the emulation: name → (C, the numpy reference, the inputs)."""
    if GXX is None:
        pytest.skip("g++ is not installed")
    names = [c[0] for c in CASES]
    return dict(zip(names, emulated(names), strict=True))


@pytest.mark.emulation
def test_int8_chains_equal_the_reference_exactly_in_the_emulation(runs):
    spread, wide = {}, []
    for name, (c, ref, _) in runs.items():
        if not name.startswith("int8/"):
            continue
        assert c.shape == ref.shape and np.array_equal(c, ref.astype(np.int64)), name
        if ref.dtype == np.int8:
            assert c.min() >= -128 and c.max() <= 127, name
            spread[name] = len(np.unique(c))
        elif np.abs(c).max() > 2**31:
            wide.append(name)
    # The data exercise what they should: requantised values, not only saturated ones; and sums beyond int32 (an
    # epilogue in int32 arithmetic would have wrapped them).
    assert len(spread) >= 8 and max(spread.values()) > 100
    assert len(wide) >= 3, wide


@pytest.mark.emulation
def test_float_chains_equal_the_reference_in_the_emulation(runs):
    # Whole-number operands: the float32 accumulation is exact whatever its order, so the float32 epilogue must
    # give the reference's every bit. Random operands: the accumulation order differs, by at most K float32
    # roundings of the sum of |products|, which is the tolerance (the chains' multiplies shrink it, never grow it).
    names = [name for name in runs if not name.startswith("int8/")]
    for name in names:
        c, ref, _ = runs[name]
        assert c.dtype == ref.dtype == np.float32 and np.array_equal(c, ref), name
    sample = names[::3]
    for name, (c, ref, ins) in zip(sample, emulated(sample, whole=False, mode="early"), strict=True):
        a, b = (np.abs(np.asarray(ins[x], np.float64)) for x in "AB")
        bound = a.shape[1] * np.finfo(np.float32).eps * (a @ b).max() * 2 + 1e-5
        assert np.max(np.abs(c.astype(np.float64) - ref)) <= bound, name


@pytest.mark.emulation
def test_the_emulation_equals_the_interpreter(runs):
    assert runs, "no emulated chains to compare"
    for name, (c, _, ins) in runs.items():
        want = np.asarray(spatialc.evaluate(built(name), ins))
        assert c.dtype == want.dtype and np.array_equal(c, want), name


@pytest.mark.emulation
@needs_gxx
def test_a_bias_read_by_row_instead_of_column_is_caught():
    def by_row(text):
        """The bias indexed by the element's row in its tile (el / 16) where it must be its column (el % 16)."""
        planted = text.replace(" * 256 + el % 16]", " * 256 + el / 16]")
        assert planted.count("el / 16]") == 1
        return planted

    names = [next(c[0] for c in CASES if c[0].startswith(f"{prec}/bias+relu/")) for prec in ("int8", "fp16")]
    (c8, ref8, _), (c16, ref16, _) = emulated(names, by_row)
    assert not np.array_equal(c8, ref8.astype(np.int64)) and not np.array_equal(c16, ref16)
