"""The two-layer MLP (examples/mlp.py): a matmul of a computed operand, proved by rule 8, run by the interpreter and
the reference alike, and its faults refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import spatialc
from spatialc import lang
from spatialc.errors import SemanticError
from spatialc.lang.source import python_source
from spatialc.numerics.reference import reference

from .test_lang import EXAMPLES, example, line_of

MLP = EXAMPLES / "mlp.py"


def real_inputs(seed: int = 1) -> dict[str, np.ndarray]:
    """Real-valued data (not exact in bf16: the inputs and the hidden layer are rounded)."""
    rng = np.random.default_rng(seed)
    return {
        "X": rng.standard_normal((64, 64)).astype(np.float32),
        "W1": (rng.standard_normal((64, 128)) / 8).astype(np.float32),
        "W2": (rng.standard_normal((128, 64)) / 8).astype(np.float32),
    }


def test_the_mlp_is_verified_and_computes_gelu_of_x_w1_rounded_then_times_w2():
    mlp = example("mlp")
    program = mlp.mlp()
    assert program.verified
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the inputs are rounded to bf16, and said so
        x = {k: spatialc.inputs.round_bf16(v).astype(np.float32) for k, v in real_inputs().items()}
    y = spatialc.evaluate(program, x)
    assert np.array_equal(y, mlp.numpy_mlp(x["X"], x["W1"], x["W2"]))
    assert np.array_equal(y, reference(program, x))
    # The hidden layer is rounded to bf16 before the second matmul: without that rounding numpy gets another Y.
    from spatialc.ir.ops import Activation
    from spatialc.numerics.epilogue import apply, start

    hidden = apply(Activation("gelu_tanh"), start(x["X"].astype(np.float64) @ x["W1"], False), False, None)
    assert not np.array_equal(y, (hidden.astype(np.float64) @ x["W2"]).astype(np.float32))


def test_the_mlps_tolerance_holds_the_interpreter_and_refuses_a_wrong_y():
    program = example("mlp").mlp()
    x = real_inputs(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = spatialc.evaluate(program, x)
        tol = spatialc.tolerance(program, kernel=True)
        ok, _ = tol.check(y, x)
        assert ok and "computed operand" in tol.text
        wrong = y.copy()
        wrong[5, 7] += 0.25
        assert not tol.check(wrong, x)[0]


def test_the_mlp_in_fp16_is_verified_and_matches_the_reference():
    source = MLP.read_text().replace('precision="bf16"', 'precision="fp16"')
    scope: dict[str, object] = {"__name__": "mlp_fp16"}
    exec(compile(source, str(MLP), "exec"), scope)
    program = scope["mlp"]()  # type: ignore[operator]
    x = real_inputs(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.array_equal(spatialc.evaluate(program, x), reference(program, x))


def test_the_mlp_printed_as_python_traces_back_to_itself():
    program = example("mlp").mlp()
    scope: dict[str, object] = {}
    source = python_source(program)
    assert 'Activation("gelu_tanh")' in source and 'Activation("gelu")' not in source  # bare gelu is warned of
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        exec(compile(source, "<mlp>", "exec"), scope)
        assert scope["program"]() == program  # type: ignore[operator]


@pytest.mark.parametrize(
    ("old", "new", "error", "where", "says"),
    [
        # the hidden tiles are layer 1's for W1's first 64 columns only, whatever the hidden step
        ("page.read(W1, 4 * w1_cols * kk + 4 * h, 4, 4)", "page.read(W1, 4 * w1_cols * kk, 4, 4)", SemanticError,
         "writer: WriteTiles", "in its operand A of stage layer2"),
        # W2's rows do not follow the hidden step: its first 4 k-tiles twice, the last 4 never
        ("page.read(W2, 4 * w2_cols * h + 4 * item.x, 4, 4)", "page.read(W2, 4 * item.x, 4, 4)", SemanticError,
         "writer: WriteTiles", "k-tile 0 2 times"),
        # another activation than the stage declares
        ('e.compute(Activation("gelu_tanh"), s, g)', 'e.compute(Activation("tanh"), s, g)', SemanticError,
         "compute: Compute", "declares gelu"),
        # the second matmul multiplies the packed sums, skipping the gelu page: refused where it is traced, since
        # layer2's stage multiplies hidden's pages
        ("g, w2 = hidden.wait(), w2_ring.wait()", "g, w2 = sums.wait(), w2_ring.wait()", lang.LangError,
         "", "stage layer2 multiplies pages of hidden and W2_ring; these are of sums and W2_ring"),
        # the hidden page is never freed (rule 5: the ring does not end empty, named where it is pushed)
        ("                g.pop()\n", "", spatialc.VerifyError, "", "hidden has 4 page(s) pushed (by compute) but 0"),
        # W2 of the wrong height: the hidden width and W2's rows disagree
        ('W2 = p.input("W2", H, N)', 'W2 = p.input("W2", H // 2, N)', spatialc.VerifyError, "", "W2"),
    ],
)  # fmt: skip
def test_a_wrong_mlp_is_refused_at_its_line(tmp_path: Path, old, new, error, where, says):
    source = MLP.read_text()
    assert old in source
    path = tmp_path / "mlp.py"
    path.write_text(source.replace(old, new))
    scope: dict[str, object] = {"__name__": "wrong_mlp"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    with pytest.raises(error) as caught:
        scope["mlp"]()  # type: ignore[operator]
    text = str(caught.value)
    assert says in text, text
    if where.startswith(("writer", "compute")):
        assert f"{path}:" in text and where in text, text
    if new.startswith("page.read("):  # the wrong read is named too, at its line
        assert f"{path}:{line_of(path, new)}: site 0 reader: ReadTiles" in text, text
    if where == "compute: Compute":
        assert f"{path}:{line_of(path, new)}:" in text, text
    if "pushed" in says:  # the ring's pushes (and pops, of which there are none), each at its line
        push = line_of(path, "with sums.wait() as s, hidden.reserve() as g:")
        assert f"{path}:{push}: site 0 compute: Push hidden" in text, text
    if error is lang.LangError:
        assert caught.value.line == line_of(path, "acc2.matmul(layer2, g, w2)"), text


def int8_mlp(requant: bool):
    """The example in int8: its gelu replaced by a requant to int8 (or, wrongly, by a relu, which leaves int32)."""
    op = "Requant(1 << 30, -12, 0)" if requant else "Relu()"
    source = MLP.read_text().replace('precision="bf16"', 'precision="int8"').replace('Activation("gelu_tanh")', op)
    source = source.replace(
        "from spatialc.ir.ops import Activation", "from spatialc.ir.ops import Activation, Relu, Requant"
    )
    # int8 tensor cores read A from row pages and B K-major (ir.nodes.PageLayout), as build lays an int8 GEMM out.
    layouts = {
        'p.input("W1", K, H)': 'p.input("W1", K, H, order="col")',
        'p.input("W2", H, N)': 'p.input("W2", H, N, order="col")',
        '"W1_ring", depth=2, tiles=4 * 4, layout="swizzled"': '"W1_ring", depth=2, tiles=4 * 4, layout="col"',
        '"W2_ring", depth=2, tiles=4 * 4, layout="swizzled"': '"W2_ring", depth=2, tiles=4 * 4, layout="col"',
        '"X_ring", depth=2, tiles=2 * 4, layout="swizzled"': '"X_ring", depth=2, tiles=2 * 4',
    }
    for old, new in layouts.items():
        assert old in source
        source = source.replace(old, new)
    scope: dict[str, object] = {"__name__": "mlp_int8"}
    exec(compile(source, str(MLP), "exec"), scope)
    return scope["mlp"]


def test_an_int8_mlp_multiplies_requantised_int8_and_is_exact():
    program = int8_mlp(True)()
    rng = np.random.default_rng(4)
    x = {"X": rng.integers(-128, 128, (64, 64)), "W1": rng.integers(-128, 128, (64, 128)),
         "W2": rng.integers(-128, 128, (128, 64))}  # fmt: skip
    x = {k: v.astype(np.int8) for k, v in x.items()}
    y = spatialc.evaluate(program, x)
    assert np.array_equal(y, reference(program, x))
    hidden = spatialc.numerics.quant.requantize(x["X"].astype(np.int64) @ x["W1"], 1 << 30, -12, 0)
    assert np.array_equal(y, hidden.astype(np.int64) @ x["W2"])


def test_an_int8_mlp_whose_hidden_layer_is_not_int8_is_refused():
    with pytest.raises(SemanticError, match="computed operand A is not requantised to int8 last"):
        int8_mlp(False)()


def test_a_message_names_the_users_loops_by_their_names(tmp_path: Path):
    # acc1 zeroed once per item instead of once per hidden step: its pack reads a sum the h loop still adds to.
    source = MLP.read_text()
    for old, new in (
        ("            acc2.acquire()\n", "            acc2.acquire()\n            acc1.acquire()\n"),
        ("                acc1.acquire()\n", ""),
        ("                acc1.release()\n", ""),
    ):
        assert source.count(old) == 1
        source = source.replace(old, new)
    path = tmp_path / "mlp.py"
    path.write_text(source)
    scope: dict[str, object] = {"__name__": "acc_per_item"}
    exec(compile(source, str(path), "exec"), scope)
    with pytest.raises(SemanticError) as caught:
        scope["mlp"]()  # type: ignore[operator]
    text = str(caught.value)
    assert "site 0 compute [in item, h]: PackAcc acc1" in text and "the loop Loop h < 2: around it" in text, text
    assert "lv" not in text and f"{path}:{line_of(path, 'acc1.pack(page)')}:" in text
