"""Block scales on grouped GEMMs (issue 34): `grouped_gemm(..., "e4m3", scales=("1x128", "128x128"))`, DeepGEMM's
grouped fp8 kernels of a mixture-of-experts layer — each expert g its own B_g with 128×128 scales sb[g], A's rows of
the group with 1×128 scales sa[g]. The scale tensors are shaped a matrix a group; the interpreter equals a naive sum
written apart from numerics.blockscale, with ragged row counts (a group of none among them); rule 8 refuses a
scale of another expert and the wrong row / column / K group edits; the general form under the host emulation is
within the kernel's bound, and a scale of the wrong expert planted in its text is caught; nvcc -Werror compiles a
realistic shape (8 experts × 512 rows × 4096 × 7168) for sm_89 and sm_90 without spills."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc.errors import IllFormedError, ProgramError, SemanticError, SpatialError, VerifyError
from spatialc.inputs import InputError, specs_of
from spatialc.ir.ids import LV_ITEM_X, LV_ITEM_Y, LV_K, LV_ROW, LoopVar
from spatialc.ir.nodes import SpatialProgram
from spatialc.ir.ops import TileAddr
from spatialc.ir.printer import program_text
from spatialc.numerics.blockscale import program_scales
from spatialc.numerics.reference import reference
from spatialc.passes.verify import verify
from spatialc.runtime.cache import cache_dir

from ..nvcc_clean import NVCC, assert_clean, nvcc_compile
from .programs import FORMATS, naive
from .test_mutations import compute, matmuls, scales

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
GROUPS, ROWS, N, K = 3, 40, 160, 256  # two column blocks of B's 128 × 128 scales, two K groups
SIZES = np.array([40, 0, 17], np.int32)  # one group full, one empty, one ragged


def grouped(layouts=("1x128", "128x128"), prec="e4m3", target="sm_89", **kw) -> SpatialProgram:
    gemm = spatialc.grouped_gemm(GROUPS, ROWS, N, K, prec, scales=layouts)
    return spatialc.build(gemm, target, form="general", **kw)


def inputs_of(p: SpatialProgram, seed: int = 0, sizes=SIZES) -> dict[str, np.ndarray]:
    """A and B of the operand type; each scale a float32 in [1, 2) times 2^-4 … 2^4, so that experts, rows, columns
    and K groups all differ."""
    rng = np.random.default_rng(seed)
    fmt = FORMATS[p.precision.value]
    out = {
        "A": rng.normal(size=(GROUPS, ROWS, K)).astype(fmt),
        "B": rng.normal(size=(GROUPS, K, N)).astype(fmt),
        "sizes": np.asarray(sizes, np.int32),
    }
    s = program_scales(p)
    assert s is not None
    for x in (s.a, s.b):
        t = p.tensor(x.tensor)
        shape = (t.groups, *t.elems)
        out[t.name] = (rng.uniform(1, 2, shape) * np.exp2(rng.integers(-4, 5, shape))).astype(np.float32)
    return out


def naive_grouped(p: SpatialProgram, ins: dict[str, np.ndarray]) -> np.ndarray:
    """Each group's naive block-scaled sum (`programs.naive`, from the layouts' definition) with its own scales,
    its rows at or past its count zero."""
    out = []
    for g in range(GROUPS):
        one = {name: ins[name][g] for name in ("A", "B", "scale_a", "scale_b")}
        c = naive(p, one)
        c[int(ins["sizes"][g]) :] = 0
        out.append(c)
    return np.stack(out)


# ---- the frontend, the interpreter and the reference ------------------------------------------------------------


@pytest.mark.parametrize(
    ("layouts", "a_shape", "b_shape"),
    [
        (("1x128", "128x128"), (40, 2), (2, 2)),
        (("row", "col"), (40, 1), (1, 160)),
        (("tensor", "128x1"), (1, 1), (2, 160)),
    ],
)
def test_scale_tensors_are_a_matrix_a_group(layouts, a_shape, b_shape):
    p = spatialc.grouped_gemm(GROUPS, ROWS, N, K, "e4m3", scales=layouts)
    got = {t.name: (t.groups, t.elems) for t in p.tensors}
    assert got["scale_a"] == (GROUPS, a_shape) and got["scale_b"] == (GROUPS, b_shape)
    specs = {s.name: s.shape for s in specs_of(p)}
    assert specs["scale_a"] == (GROUPS, *a_shape) and specs["scale_b"] == (GROUPS, *b_shape)


@pytest.mark.parametrize("layouts", [("1x128", "128x128"), ("row", "col"), ("tensor", "128x1")])
def test_the_interpreter_equals_a_naive_sum_each_group_with_its_own_scales(layouts):
    p = grouped(layouts)
    ins = inputs_of(p, seed=3)
    c = spatialc.evaluate(p, ins)
    assert np.array_equal(c, reference(p, ins))  # the one definition, bit for bit
    want = naive_grouped(p, ins)
    assert np.allclose(c, want, rtol=2**-23, atol=0) and np.abs(want[0]).max() > 0  # C is float32: one rounding
    assert not c[1].any() and not c[2, 17:].any()  # the empty group and the ragged one's rows past its count


def test_an_experts_scales_reach_its_own_rows_only():
    p = grouped()
    ins = inputs_of(p, seed=5)
    before = spatialc.evaluate(p, ins)
    ins["scale_b"] = ins["scale_b"].copy()
    ins["scale_b"][2, 1, 0] *= 2  # expert 2's second K group, first column block
    after = spatialc.evaluate(p, ins)
    assert np.array_equal(after[:2], before[:2])
    assert np.array_equal(after[2, :, 128:], before[2, :, 128:])
    assert not np.array_equal(after[2, :17, :128], before[2, :17, :128])


def test_the_reference_and_the_bound_take_the_scales_evaluate_takes():
    """Scales of another shape (the groups' matrices stacked as one, a group's alone) or none at all: the same
    InputError from the reference and the bound as from evaluate — not numpy's reshape of the stacked rows into
    groups, accepted, nor a ValueError or KeyError."""
    p = grouped()
    ins = inputs_of(p)
    for name, given in (("scale_a", ins["scale_a"].reshape(GROUPS * ROWS, -1)), ("scale_b", ins["scale_b"][0])):
        wrong = dict(ins, **{name: given})
        for call in (spatialc.evaluate, reference, lambda p, x: spatialc.tolerance(p, kernel=True).bound(x)):
            with pytest.raises(InputError, match=rf"tensor {name}: expected shape \(3, "):
                call(p, wrong)
    with pytest.raises(InputError, match=r"needs tensor scale_b, which is not among the inputs"):
        reference(p, {k: v for k, v in ins.items() if k != "scale_b"})


def test_refusals():
    with pytest.raises(ProgramError, match="block scales are for 8-bit float operands"):
        spatialc.grouped_gemm(GROUPS, ROWS, N, K, "bf16", scales=("1x128", "128x128"))
    with pytest.raises(ProgramError, match="unknown scale layout"):
        spatialc.grouped_gemm(GROUPS, ROWS, N, K, "e4m3", scales=("1x128", "sideways"))
    p = spatialc.build(spatialc.grouped_gemm(GROUPS, ROWS, N, K, "e4m3", scales=("1x128", "128x128")), "sm_90")
    with pytest.raises(SpatialError, match="trip count is read from data"):  # as any grouped GEMM: general form only
        spatialc.lower(p, form="persistent")


# ---- rule 8 -----------------------------------------------------------------------------------------------------

H = 4  # the plan's rows of tiles an item (checked in `base`)

MUTATIONS = {
    "the next expert's scales": (
        scales(group=TileAddr(1, ((LV_ITEM_Y, 1),))),
        r"promotes group \d+'s products with the scales of group \d+ .*a scale of another group \(expert\)",
    ),
    "expert 0's scales for every group": (
        scales(group=TileAddr(0)),
        r"promotes group [12]'s products with the scales of group 0",
    ),
    "the scales of no group": (scales(group=None), r"promotes group \d+'s products with no group"),
    "A's scales at the stacked row, not the group's": (
        scales(rows=TileAddr(0, ((LV_ITEM_Y, H), (LV_ROW, H)))),
        r"promotes with scale_a \(A's scales\) at tile row \d+, not its own \d+",
    ),
    "A's scales a row block down": (
        scales(rows=TileAddr(H, ((LV_ROW, H),))),
        r"scale_a \(A's scales\) at tile row",
    ),
    "B's scales of the next column block": (
        scales(cols=TileAddr(8, ((LV_ITEM_X, 1),))),
        r"promotes with scale_b \(B's\) at tile column \d+, not its own \d+",
    ),
    "B's scales at the expert's index": (
        scales(cols=TileAddr(0, ((LV_ITEM_Y, 1),))),
        r"scale_b \(B's\) at tile column",
    ),
    "the scales of the next K group": (
        scales(k=TileAddr(8, ((LV_K, 8),))),
        r"with the scales of the step at K tile \d+: a scale of another K group",
    ),
}


@pytest.fixture(scope="module")
def base() -> SpatialProgram:
    p = grouped()
    assert p.plan.item_tiles[0] == H and p.plan.block.ibw == 8  # type: ignore[union-attr]
    return p


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_each_edit_is_refused_by_rule_8(base, name):
    edit, message = MUTATIONS[name]
    with pytest.raises(SemanticError, match=message):
        verify(compute(base, matmuls(edit)))


def test_a_scale_address_of_a_variable_no_loop_binds_is_refused(base):
    """A saved schedule whose scale row address names a loop variable no enclosing loop binds (the row loop's
    variable renumbered) passed verify, and evaluate then failed on it: rule 1 refuses it, as any address's."""
    unbound = scales(rows=lambda at: TileAddr(at.base, tuple((LoopVar(12), s) for _, s in at.steps)))
    with pytest.raises(IllFormedError, match=r"its address uses lv12, which no enclosing loop binds"):
        verify(compute(base, matmuls(unbound)))


def test_a_group_on_a_program_of_one_group_is_refused():
    p = spatialc.build(spatialc.gemm(32, 64, 256, "e4m3", scales=("1x128", "128x128")), "sm_89")
    with pytest.raises(SemanticError, match="reads its scales at group 0 of a program of one group"):
        verify(compute(p, matmuls(scales(group=TileAddr(0)))))


@pytest.mark.parametrize("groups", [2, 1])
def test_a_scale_tensor_of_fewer_groups_than_the_product_is_refused(base, groups):
    """Review 47: scale_b declared with 2 matrices (or 1) for 3 experts verified; then the interpreter stopped at the
    third expert's step (FlowError) and the reference raised an IndexError. Each scale tensor stacks one matrix a
    group of the product (check_scale_types)."""
    tensors = tuple(
        dataclasses.replace(t, groups=groups, tiles=(t.tiles[0] // GROUPS * groups, t.tiles[1]))
        if t.name == "scale_b"
        else t
        for t in base.tensors
    )
    with pytest.raises(SemanticError, match=rf"scale_b stacks {groups} matri(ces|x) of scales; the product's 3 groups"):
        verify(base.evolve(tensors=tensors))


def test_another_experts_scales_compute_something_else(base):
    """The interpreter runs the refused edit (unverified) to another C: the refusal is of a real fault."""
    ins = inputs_of(base, seed=7)
    c = spatialc.evaluate(compute(base, matmuls(scales(group=TileAddr(0)))), ins)
    assert np.array_equal(c[0], reference(base, ins)[0]) and not np.array_equal(c[2], reference(base, ins)[2])


def test_sweep_of_the_group_address_has_no_holes(base):
    """Every group address from a small sweep is refused, or is the schedule's own and computes the same."""
    ins = inputs_of(base, seed=8)
    ref = reference(base, ins)
    holes, accepted = [], []
    for b in (-1, 0, 1, 2):
        for var in (LV_ITEM_Y, LV_ITEM_X, LV_ROW, LV_K):
            for stride in (0, 1, 2):
                edit = scales(group=TileAddr(b, ((var, stride),) if stride else ()))
                try:
                    checked = verify(compute(base, matmuls(edit)))
                except VerifyError:
                    continue
                accepted.append((b, var, stride))
                if not np.array_equal(spatialc.evaluate(checked, ins), ref):
                    holes.append((b, var, stride))
    assert holes == []
    assert accepted == [(0, LV_ITEM_Y, 1)]  # the schedule's own address only


# ---- the general form: host emulation and nvcc ------------------------------------------------------------------


def emulated(p: SpatialProgram, ins, text=None) -> np.ndarray:
    art = spatialc.lower(p, form="general")
    if text is not None:
        out, n = re.subn(r"const int sg = item_y;", text, art.program_cu)
        assert n >= 1
        art = dataclasses.replace(art, program_cu=out)
    return spatialc.emulate(art, ins)


@needs_gxx
@pytest.mark.emulation
def test_the_emulated_kernel_is_within_the_bound_and_a_wrong_expert_is_caught(base):
    ins = inputs_of(base, seed=11)
    c = emulated(base, ins)
    ok, how = spatialc.tolerance(base, kernel=True).check(c, ins)
    assert ok, how
    want = spatialc.evaluate(base, ins)
    assert np.abs(c - want).max() <= 1e-5 * np.abs(want).max() and not c[1].any()
    wrong = emulated(base, ins, f"const int sg = (item_y + 1) % {GROUPS};")  # the next expert's scales
    ok, how = spatialc.tolerance(base, kernel=True).check(wrong, ins)
    assert not ok, how


@needs_gxx
@pytest.mark.emulation
def test_per_row_and_per_column_scales_emulated_within_the_bound():
    """("row", "col"): scale_b is one row of N a group (its stacked tiles kept: not taken for a bias-like vector)."""
    p = grouped(("row", "col"))
    ins = inputs_of(p, seed=12)
    ok, how = spatialc.tolerance(p, kernel=True).check(emulated(p, ins), ins)
    assert ok, how


def test_a_grouped_block_scaled_program_round_trips_through_json(base):
    back = spatialc.from_json(spatialc.to_json(base))
    assert back.schedule == base.schedule and "group 1*item_y" in program_text(back)


def _cached_compile(text: str, where: Path, ccs: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """nvcc_compile's result, kept under the compile cache by the text and nvcc's version (one compile of the large
    kernel is ~15 s on two cores)."""
    version = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout  # type: ignore[list-item]
    key = hashlib.sha256("\0".join((text, version, *ccs)).encode()).hexdigest()[:32]
    path = cache_dir("nvcc-check", create=True) / f"{key}.json"
    if path.exists():
        got = json.loads(path.read_text())
        return subprocess.CompletedProcess([], got["rc"], got["out"], got["err"])
    proc = nvcc_compile(text, where, ccs)
    if proc.returncode == 0:
        path.write_text(json.dumps({"rc": 0, "out": proc.stdout, "err": proc.stderr}))
    return proc


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_compiles_a_realistic_moe_shape_for_sm89_and_sm90_without_spills(tmp_path):
    gemm = spatialc.grouped_gemm(8, 512, 4096, 7168, "e4m3", scales=("1x128", "128x128"), out="bf16")
    art = spatialc.lower(spatialc.build(gemm, "sm_90", form="general"), form="general")
    assert "const int sg = item_y;" in art.program_cu
    assert_clean(_cached_compile(art.program_cu, tmp_path / "moe.cu", ("89", "90")), ("89", "90"))


# ---- the CLI ----------------------------------------------------------------------------------------------------


def test_the_cli_checks_a_grouped_block_scaled_gemm_and_refuses_in_one_line(capsys):
    from spatialc.cli import main

    argv = ["grouped-gemm", "3", "40", "160", "256", "--scales", "1x128,128x128", "--sizes", "40,0,17"]
    assert main([*argv, "--precision", "e4m3", "--target", "sm_89"]) == 0
    out = capsys.readouterr().out
    assert "scales 1x128,128x128" in out and "interpreter vs numpy reference: OK" in out
    assert main([*argv, "--precision", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "block scales are for 8-bit float operands" in err and len(err.strip().splitlines()) == 1


def test_the_python_guides_example_runs():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if "grouped_gemm" in b and "scales=" in b]
    space = {"np": np, "spatialc": spatialc}
    exec(compile(example, "docs/python.md", "exec"), space)
    c, p, x = space["c"], space["p"], space["x"]
    assert c.shape == (4, 64, 256) and not c[1].any() and np.array_equal(c, reference(p, x))
    # every scale 0.5 · 2.0 = 1: the plain grouped product of the fp8 operands, each group to its count
    a, b = (np.asarray(x[k], np.float64) for k in ("A", "B"))
    want = np.stack([np.where(np.arange(64)[:, None] < m, a[g] @ b[g], 0) for g, m in enumerate(x["sizes"])])
    assert np.allclose(c, want, rtol=2**-23, atol=1e-6)
