"""The two-layer MLP of examples/mlp.py — Y = gelu(X @ W1) @ W2 on one site, two tile matmuls, the second reading a
page the compute engine fills — in the general CUDA form: lowered with a set of fragments per accumulator and the
hidden ring in bf16 / fp16, emulated against the interpreter, compiled by nvcc without spills; refused by name by
the persistent and sm_90a forms, and by the general form in an int8 program without a requant before the second
matmul; and a planted race on the hidden page that the emulation catches."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc import lang
from spatialc.inputs import round_bf16
from spatialc.ir.nodes import DType, SpatialProgram, TensorRole
from spatialc.ir.ops import Activation, MatmulTiles, Precision, Relu
from spatialc.lower.cuda import forms
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.errors import NeedsGeneral, Unsupported
from spatialc.numerics.elementwise import GELU_TAIL as ACTIVATION_TAIL
from spatialc.numerics.epilogue import apply, start
from spatialc.runtime.emulate import EmulationRace
from spatialc.target import TARGETS

from ..rewrite import swap_compute
from ..stand_in import StandInDevice

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mlp.py"
NVCC = shutil.which("nvcc")
emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


@functools.cache
def example():
    """examples/mlp.py as a module (examples/ is no package)."""
    spec = importlib.util.spec_from_file_location("spatialc_example_mlp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class Case:
    """The MLP in one precision, verified."""

    program: SpatialProgram

    def lower(self, form: str = "auto", target: str = "sm_90"):
        return spatialc.lower(self.program, target, form=form)


def mlp_case(precision: str) -> Case:
    """The example in `precision`."""
    fn = example().mlp.__wrapped__
    return Case(lang.trace(fn, name=f"mlp_{precision}", precision=precision).verify())


@pytest.fixture(scope="module", params=["bf16", "fp16"])
def case(request) -> Case:
    return mlp_case(request.param)


def inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """Quarter integers in [-1, 1]: exact in bf16 and fp16, and X @ W1 exact in float32 (multiples of 1/16 below 64),
    so the layers differ between the kernel and the interpreter only where the documented numerics let them."""
    ex = example()
    rng = np.random.default_rng(seed)
    shapes = {"X": (ex.M, ex.K), "W1": (ex.K, ex.H), "W2": (ex.H, ex.N)}
    return {name: rng.integers(-4, 5, shape).astype(np.float32) / 4 for name, shape in shapes.items()}


def round_operand(x: np.ndarray, precision: str) -> np.ndarray:
    """Round to nearest even to the operand type, as values in float64."""
    return (round_bf16(x) if precision == "bf16" else x.astype(np.float16)).astype(np.float64)


def bound(x: dict[str, np.ndarray], precision: str) -> np.ndarray:
    """How far the kernel's Y may lie from the interpreter's: the documented activation tolerance carried through.

    The hidden layer's pre-activations are exact in both. The kernel's gelu is within one float32 ulp of the
    interpreter's, or ACTIVATION_TAIL·|x| in its cancelling tail (numerics.tolerance) — and a float32 ulp before the
    rounding to the operand type can flip that rounding by one operand ulp. So each hidden element may differ by the
    largest change rounding anywhere within its activation tolerance makes (zero for most); the second layer sums H
    exact products in float32 in the kernel, in float64 rounded once in the interpreter: (H + 4) float32 units of
    |hidden| @ |W2| (spatialc.numerics.tolerance's bound for a K-long sum)."""
    pre = x["X"].astype(np.float64) @ x["W1"]
    h = apply(Activation("gelu_tanh"), start(pre, False), False, None).astype(np.float64)
    slack = np.spacing(np.abs(h).astype(np.float32)).astype(np.float64) + ACTIVATION_TAIL * np.abs(pre)
    hb = round_operand(h, precision)
    flips = np.maximum(
        np.abs(round_operand(h - slack, precision) - hb), np.abs(round_operand(h + slack, precision) - hb)
    )
    w2 = np.abs(x["W2"].astype(np.float64))
    sums = (x["W1"].shape[1] + 4) * 2.0**-23 * ((np.abs(hb) + flips) @ w2)
    return flips @ w2 + sums + np.finfo(np.float32).tiny


# ---- the kernel ------------------------------------------------------------------------------------------------


def test_auto_lowers_the_mlp_in_the_general_form_with_fragments_per_accumulator(case):
    art = case.lower()
    assert art.budget.form == "general"
    text = art.kernel_cu
    # Each accumulator its own fragments, of its matmul's 2 × 4-tile block: one tile per warp of sm_90's 8.
    accs = re.findall(r"spatialc_acc<ACCT> (accf_\d+)\[(PERW_\d+)\];", text)
    assert len(accs) == 2 and all(f"#define {count} 1" in text for _, count in accs)
    assert [len(re.findall(rf"spatialc_mma\({name}\[q\]", text)) for name, _ in accs] == [1, 1]
    # The hidden page: row-major operands, filled by the gelu stage rounding to nearest even, read by the row loads.
    convert = "__float2bfloat16_rn(v)" if case.program.precision == Precision.BF16 else "__float2half_rn(v)"
    assert text.count(convert) == 1 and text.count("spatialc_load_a_row(af,") == 1
    assert ("hidden", 2 * 8 * 256) in art.budget.rings and ("hidden", "row") in art.budget.layouts
    assert art.census.printed_stages == {"Map_gelu_tanh_x0": 1, "MatmulTiles": 2}


def test_the_persistent_and_sm90a_forms_refuse_two_matmuls_by_name(case):
    with pytest.raises(NeedsGeneral, match="several tile matmuls"):
        case.lower("persistent")
    with pytest.raises(Unsupported, match="several tile matmuls: the consumer warpgroups hold one wgmma"):
        forms.lower(case.program, TARGETS["sm_90a"], "sm90a")
    note = " ".join(case.lower().notes)
    assert "several tile matmuls" in note


def test_an_int8_mlp_whose_hidden_page_no_requant_fills_is_refused():
    """int8 matmuls multiply int8 values: a relu leaves int32 sums, which the hidden page cannot hold."""
    p = swap_compute(mlp_case("bf16").program, Activation("gelu_tanh"), Relu())
    (mm,) = {s.kind.op for s in p.stages if isinstance(getattr(s.kind, "op", None), MatmulTiles)}
    p = swap_compute(p, mm, dataclasses.replace(mm, operand=Precision.INT8))
    tensors = tuple(dataclasses.replace(t, dtype=DType.INT8) if t.role == TensorRole.INPUT else t for t in p.tensors)
    p = dataclasses.replace(p.evolve(tensors=tensors), verified=True)  # the lowering's own refusal is under test
    with pytest.raises(Unsupported, match="of int8 matmul layer2, filled by a relu stage: .* end the stages before"):
        general.lower(p, TARGETS["sm_90"])


# ---- the emulation -----------------------------------------------------------------------------------------------


@emulation
@pytest.mark.emulation
def test_the_emulated_kernel_is_within_the_propagated_tolerance_of_the_interpreter(case):
    x = inputs()
    ref = spatialc.evaluate(case.program, x).astype(np.float64)
    y = spatialc.emulate(case.lower(), x, mode="late").astype(np.float64)
    allowed = bound(x, case.program.precision.value)
    assert (np.abs(y - ref) <= allowed).all(), float(np.max(np.abs(y - ref) - allowed))
    # spatialc's own stated bound for a kernel (carried stage by stage, for any inputs) holds too.
    ok, said = spatialc.tolerance(case.program, kernel=True).check(y, x)
    assert ok, said
    # A bound that means something: far below the values, and one a kernel that multiplied the float32 hidden layer,
    # unrounded, would break.
    assert allowed.max() < 1e-4 * np.abs(ref).max()
    h = apply(Activation("gelu_tanh"), start(x["X"].astype(np.float64) @ x["W1"], False), False, None)
    unrounded = h.astype(np.float64) @ x["W2"]
    assert np.count_nonzero(np.abs(unrounded - ref) > allowed) > ref.size // 10


@emulation
@pytest.mark.emulation
def test_a_matmul_reading_the_hidden_page_before_its_full_barrier_is_a_race():
    """The planted fault: the second matmul's Wait on `hidden` printed as a bare count. Its warps read the page the
    others' gelu stores are still filling; only the full barrier orders those stores before the loads — caught in
    both modes, between a gelu store and an ldmatrix of the same bytes."""
    case = mlp_case("bf16")
    art = case.lower()
    r = next(int(b.ring) for b in case.program.buffers if b.name == "hidden")
    wait = f"spatialc_mbar_wait(&full_{r}[wt_{r} % DEPTH_{r}], (wt_{r} / DEPTH_{r}) & 1); ++wt_{r};"
    assert art.program_cu.count(wait) == 1
    broken = dataclasses.replace(art, program_cu=art.program_cu.replace(wait, f"++wt_{r};"))
    for mode in ("late", "early"):
        with pytest.raises(EmulationRace) as caught:
            spatialc.emulate(broken, inputs(), mode=mode, timeout=60)
        race = str(caught.value)
        assert f"RACE on shared ring 'ring_{r}'" in race, race
        assert "a page store" in race and "a fragment load (ldmatrix)" in race, race


# ---- nvcc --------------------------------------------------------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_compiles_the_mlp_kernel_clean_without_spills(case, tmp_path):
    from spatialc.runtime.sass import disassemble, find_cuobjdump

    src, cubin = tmp_path / "mlp.cu", tmp_path / "mlp.cubin"
    src.write_text(case.lower().kernel_cu)
    cmd = [NVCC, "-cubin", "-gencode=arch=compute_90,code=sm_90", "-O3", "-std=c++17", "-Werror", "all-warnings"]
    done = subprocess.run([*cmd, "-Xptxas", "-v", "-o", str(cubin), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in done.stderr
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    ops = Counter(i.base for i in disassemble(cubin, tool).instrs)
    # Two matmuls of 4 K tiles a warp, each an A and a B ldmatrix and two m16n8k16 HMMAs a tile.
    assert ops["LDSM"] == 16 and ops["HMMA"] == 16, ops


@emulation
@pytest.mark.emulation
def test_an_int8_mlp_with_a_requantised_hidden_layer_is_emulated_exactly():
    from ..lang.test_mlp import int8_mlp

    program = int8_mlp(True)()
    art = spatialc.lower(program)
    assert art.budget.form == "general" and "(signed char)" in art.kernel_cu
    rng = np.random.default_rng(6)
    x = {"X": rng.integers(-128, 128, (64, 64)), "W1": rng.integers(-128, 128, (64, 128)),
         "W2": rng.integers(-128, 128, (128, 64))}  # fmt: skip
    x = {k: v.astype(np.int8) for k, v in x.items()}
    assert np.array_equal(spatialc.emulate(art, x, mode="late"), spatialc.evaluate(program, x))


@emulation
@pytest.mark.emulation
def test_a_gemm_whose_a_pages_are_row_major_reads_them_with_the_row_load_in_both_forms():
    """The row-major A load the MLP's hidden page needs serves any 16-bit A page laid out by rows (a hand-edited
    program's): both forms print it, and the emulation runs it to the right C."""
    from spatialc.ir.nodes import Fifo, PageLayout

    p = spatialc.build(spatialc.gemm(64, 64, 64, "bf16"), "sm_90", sites=1)
    rows = tuple(
        dataclasses.replace(b, kind=dataclasses.replace(b.kind, layout=PageLayout.ROW))
        if b.name == "A_ring" and isinstance(b.kind, Fifo)
        else b
        for b in p.buffers
    )
    q = spatialc.verify(dataclasses.replace(p.evolve(buffers=rows), verified=False))
    rng = np.random.default_rng(7)
    x = {"A": rng.integers(-4, 5, (64, 64)).astype(np.float32), "B": rng.integers(-4, 5, (64, 64)).astype(np.float32)}
    for form in ("persistent", "general"):
        art = spatialc.lower(q, form=form)
        assert "spatialc_load_a_row(" in art.kernel_cu
        assert np.array_equal(spatialc.emulate(art, x, mode="late"), x["A"] @ x["B"]), form


def test_run_binds_the_mlps_three_inputs_by_position_or_by_name():
    from spatialc.runtime import launch as L
    from spatialc.runtime.tilize import bf16_to_float32, untilize

    art = mlp_case("bf16").lower()
    x = inputs(1)
    params = L.kernel_args(art.launch)
    assert [a.name for a in params if a.role == "input"] == ["X", "W1", "W2"]
    for how in ("position", "name"):
        dev = StandInDevice(art)  # its kernel leaves C as it is; it keeps what each argument was given
        if how == "position":
            L.run_with(dev, art, x["X"], x["W1"], x["W2"])
        else:
            L.run_with(dev, art, W2=x["W2"], X=x["X"], W1=x["W1"])
        for arg, given in zip(params, dev.launches[-1][4][: len(params)], strict=True):
            if arg.role == "input":
                full = (arg.tiles[0] * 16, arg.tiles[1] * 16)
                got = bf16_to_float32(untilize(given, arg.tiles, full, np), np)[: arg.elems[0], : arg.elems[1]]
                assert np.array_equal(got, x[arg.name]), (how, arg.name)
    with pytest.raises(spatialc.InputError, match="4 arrays given by position, but this kernel has 3 input"):
        L.run_with(StandInDevice(art), art, x["X"], x["W1"], x["W2"], x["W2"])
    with pytest.raises(spatialc.InputError, match="W1 given twice"):
        L.run_with(StandInDevice(art), art, x["X"], x["W1"], W1=x["W1"], W2=x["W2"])
    with pytest.raises(spatialc.InputError, match="W2"):
        L.run_with(StandInDevice(art), art, x["X"], x["W1"])


def test_a_hidden_page_laid_out_swizzled_is_refused_by_the_lowering():
    """An elementwise stage stores its page row by row; a swizzled hidden ring (which verify accepts: the layout is
    the kernel's business) would be read by the swizzled A load from places the stage never wrote."""
    source = EXAMPLE.read_text()
    old = 'hidden = p.ring("hidden", depth=1, tiles=2 * 4, kind="interm")'
    assert old in source
    scope: dict[str, object] = {"__name__": "swizzled_hidden"}
    exec(compile(source.replace(old, old[:-1] + ', layout="swizzled")'), str(EXAMPLE), "exec"), scope)
    with pytest.raises(Unsupported, match="the operand page hidden of matmul layer2, laid out swizzled"):
        spatialc.lower(scope["mlp"]())  # type: ignore[operator]


@emulation
@pytest.mark.emulation
def test_a_bias_in_the_hidden_chain_as_wide_as_the_hidden_layer_is_emulated_within_tolerance():
    from ..hostile.test_hostile_mlp import edited, factory, hidden_bias
    from ..hostile.test_hostile_mlp import inputs as hostile_inputs

    program = factory(edited(*hidden_bias("4 * h", "M, K, H, N = 64, 128, 128, 64", width="H")))()
    x = hostile_inputs(program, 0)
    y = spatialc.emulate(spatialc.lower(program), x, mode="late")
    ok, said = spatialc.tolerance(program, kernel=True).check(y, x)
    assert ok, said
