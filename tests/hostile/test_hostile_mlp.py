"""A hostile review of rule 8's matmul of a computed operand (the two-layer MLP, examples/mlp.py).

Each test is one attack on verify: the example's source edited (as tests/lang/test_mlp.py does), or a program of its
own (the computed operand as B, three layers), then built. A program verify refuses must be refused with a
VerifyError naming the fault; a program it accepts must compute, in the interpreter, exactly what the numpy
reference computes (the inputs are small multiples of 1/4, so every sum is exact and equality is exact).

Four holes it found, each now a test of the fixed behaviour (the end of this file):
  - a bias inside the hidden chain was checked (rule 1) against the *output's* width, not the hidden width: with a
    hidden width H below N, a bias N wide was accepted, yet the reference cannot add it (H columns + N values) —
    rule 8 now checks each bias against the width of the values it is added to;
  - the same check refused a correct bias H wide in the hidden chain (H ≠ N) with a misleading message;
  - a computed operand's padding tiles were summed as if they were zero: they hold chain(0), which an fp16 chain
    can make inf, and inf · 0 (the tensor operand's padding) is NaN where the reference is finite — a sum over
    them is now refused unless chain(0) is finite in the operand type;
  - a computed operand B (Y = P @ gelu(X @ W1)) was verified, but the interpreter crashed on it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest

import spatialc
from spatialc import lang
from spatialc.errors import IllFormedError, SemanticError, StrongerCheckNeeded, TileBoundsError, VerifyError
from spatialc.numerics.reference import reference

from ..lang.test_lang import EXAMPLES

MLP = EXAMPLES / "mlp.py"

# ---- helpers -----------------------------------------------------------------------------------------------------

Edit = tuple[str, str]


def edited(*edits: Edit, text: str | None = None) -> str:
    """The example's source (or `text`) with each (old, new) replaced; every old must be there."""
    source = MLP.read_text() if text is None else text
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return source


def factory(source: str, name: str = "hostile_mlp") -> Callable[[], spatialc.SpatialProgram]:
    """The `mlp` the source defines (calling it traces and verifies the program)."""
    scope: dict[str, object] = {"__name__": name}
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope["mlp"]  # type: ignore[return-value]


def inputs(program, seed: int = 0) -> dict[str, np.ndarray]:
    """Every input and parameter: int8 integers, or multiples of 1/4 in -1..1 (exact in bf16 / fp16)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in program.tensors:
        if t.role.value not in ("input", "parameter"):
            continue
        shape = (t.groups * t.elems[0], t.elems[1])
        if t.dtype.value == "int8":
            out[t.name] = rng.integers(-128, 128, shape).astype(np.int8)
        else:
            out[t.name] = (rng.integers(-4, 5, shape) / 4).astype(np.float32)
    return out


def run_both(program, x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spatialc.evaluate(program, x), reference(program, x)


def assert_exact(source: str, seeds=(0, 1)) -> None:
    """Accepted, and the interpreter equals the reference."""
    program = factory(source)()
    assert program.verified
    for seed in seeds:
        y, want = run_both(program, inputs(program, seed))
        assert np.array_equal(y, want, equal_nan=True), f"seed {seed}: the interpreter differs from the reference"


def assert_refused(source: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as caught:
        factory(source)()
    assert says in str(caught.value), str(caught.value)


def assert_refused_or_exact(program_of: Callable[[], spatialc.SpatialProgram], x: dict[str, np.ndarray]) -> None:
    """The contract: refused by verify, or accepted and equal to the reference."""
    try:
        program = program_of()
    except VerifyError:
        return
    y, want = run_both(program, x)
    assert np.array_equal(y, want, equal_nan=True)


# ---- edits of the example ----------------------------------------------------------------------------------------

SIZES = "M, K, H, N = 64, 64, 128, 64"
K128 = (SIZES, "M, K, H, N = 64, 128, 128, 64")  # two K steps: the k loop gets a symbol of its own
W1 = "page.read(W1, 4 * w1_cols * kk + 4 * h, 4, 4)"
W2 = "page.read(W2, 4 * w2_cols * h + 4 * item.x, 4, 4)"
X = "page.read(X, 2 * x_cols * item.y + 4 * kk, 2, 4)"
GELU = 'e.compute(Activation("gelu_tanh"), s, g)'
GELU_STAGE = 'p.elementwise("gelu", Activation("gelu_tanh"), sums, hidden)'
HIDDEN = 'hidden = p.ring("hidden", depth=1, tiles=2 * 4, kind="interm")'
PLACE = "p.place([list(range(grid[0] * grid[1]))])"
IMPORTS = (
    "from spatialc.ir.ops import Activation",
    "from spatialc.ir.ops import Activation, Bias, Relu, Requant, Scalar\nfrom spatialc.lang.handles import address",
)
NAMED = (  # the compute engine's item and h loop, named (a bias's address uses them)
    '        for _ in e.items():\n            acc2.acquire()\n            for _ in e.range(h_steps, "h"):',
    '        for item in e.items():\n            acc2.acquire()\n            for h in e.range(h_steps, "h"):',
)
LAYER2 = """                with sums.wait() as s, hidden.reserve() as g:
                    e.compute(Activation("gelu_tanh"), s, g)
                g, w2 = hidden.wait(), w2_ring.wait()
                acc2.matmul(layer2, g, w2)
                g.pop()
                w2.pop()
"""
LAYER1 = """            for _ in e.range(h_steps, "h"):
                acc1.acquire()
                for _ in e.range(k_steps, "k"):
                    x, w1 = x_ring.wait(), w1_ring.wait()
                    acc1.matmul(layer1, x, w1)
                    x.pop()
                    w1.pop()
                with sums.reserve() as page:
                    acc1.pack(page)
                acc1.release()
                with sums.wait() as s, hidden.reserve() as g:
                    e.compute(Activation("gelu_tanh"), s, g)
"""
READ_W2 = """                with w2_ring.reserve() as page:
                    page.read(W2, 4 * w2_cols * h + 4 * item.x, 4, 4)
"""
DEEP_HIDDEN = ('hidden = p.ring("hidden", depth=1,', 'hidden = p.ring("hidden", depth=2,')


def two_loops(w2: str = "4 * w2_cols * h + 4 * item.x") -> list[Edit]:
    """Every hidden page of the item first (a ring two deep), then the second matmul over them in a loop of its own
    (and the reader's W2 reads in a loop of their own, `w2` the address)."""
    tail = LAYER2[LAYER2.index("                g, w2") :]
    return [
        K128,
        DEEP_HIDDEN,
        (LAYER1 + tail, LAYER1 + '            for _ in e.range(h_steps, "h2"):\n' + tail),
        (READ_W2, ""),
        ("                        page.read(W1, 4 * w1_cols * kk + 4 * h, 4, 4)\n",
         "                        page.read(W1, 4 * w1_cols * kk + 4 * h, 4, 4)\n"
         '            for h in e.range(h_steps, "h2"):\n'
         "                with w2_ring.reserve() as page:\n"
         f"                    page.read(W2, {w2}, 4, 4)\n"),
    ]  # fmt: skip


def twice_per_h() -> list[Edit]:
    """Two hidden pages per h step (gelu of the same sums twice), both multiplied by W2's rows of that step."""
    layer2 = """                with sums.wait() as s:
                    for _ in e.range(2, "t"):
                        with hidden.reserve() as g:
                            e.compute(Activation("gelu_tanh"), s, g)
                for _ in e.range(2, "t"):
                    g, w2 = hidden.wait(), w2_ring.wait()
                    acc2.matmul(layer2, g, w2)
                    g.pop()
                    w2.pop()
"""
    read = """                for t in e.range(2, "t"):
                    with w2_ring.reserve() as page:
                        page.read(W2, 4 * w2_cols * h + 4 * item.x, 4, 4)
"""
    return [K128, DEEP_HIDDEN, (LAYER2, layer2), (READ_W2, read)]


def hidden_bias(at: str, sizes: str = "M, K, H, N = 64, 128, 128, 128", width: str = "H") -> list[Edit]:
    """A bias stage before the gelu of the hidden chain, over the bias tile columns at `at` (compute's loops)."""
    return [
        (SIZES, sizes),
        IMPORTS,
        NAMED,
        ('Y = p.output("Y", M, N)', f'Y = p.output("Y", M, N)\n    B1 = p.parameter("B1", 1, {width})'),
        (GELU_STAGE, 'biased = p.ring("biased", depth=1, tiles=2 * 4, kind="interm")\n'
         '    p.elementwise("bias1", Bias(B1.id), sums, biased)\n'
         '    p.elementwise("gelu", Activation("gelu_tanh"), biased, hidden)'),
        ("                with sums.wait() as s, hidden.reserve() as g:\n                    " + GELU,
         "                with sums.wait() as s, biased.reserve() as b:\n"
         f"                    e.compute(Bias(B1.id, address({at}), 4), s, b)\n"
         "                with biased.wait() as b, hidden.reserve() as g:\n"
         '                    e.compute(Activation("gelu_tanh"), b, g)'),
    ]  # fmt: skip


def chain_of_two(first: str, second: str) -> list[Edit]:
    """The hidden chain declared gelu then × 3; the schedule runs `first` then `second`."""
    return [
        K128,
        IMPORTS,
        (GELU_STAGE, 'mid = p.ring("mid", depth=1, tiles=2 * 4, kind="interm")\n'
         '    p.elementwise("gelu", Activation("gelu_tanh"), sums, mid)\n'
         '    p.elementwise("scale", Scalar("mul", 3.0), mid, hidden)'),
        ("                with sums.wait() as s, hidden.reserve() as g:\n                    " + GELU,
         "                with sums.wait() as s, mid.reserve() as m:\n"
         f"                    e.compute({first}, s, m)\n"
         "                with mid.wait() as m, hidden.reserve() as g:\n"
         f"                    e.compute({second}, m, g)"),
    ]  # fmt: skip


def hidden_op(op: str, precision: str = "bf16") -> list[Edit]:
    """The hidden chain's one stage (declared and scheduled) `op`, in `precision`."""
    return [IMPORTS, (GELU_STAGE, f'p.elementwise("gelu", {op}, sums, hidden)'), (GELU, f"e.compute({op}, s, g)"),
            ('precision="bf16"', f'precision="{precision}"')]  # fmt: skip


# H = 96: six tiles of hidden width, padded to eight (two h steps of a 4-tile block) in W1's and W2's grids.
PADDED_H = [
    (SIZES, "M, K, H, N = 64, 64, 96, 64"),
    ('W1 = p.input("W1", K, H)', 'W1 = p.input("W1", K, H, tiles=(K // 16, 8))'),
    ('W2 = p.input("W2", H, N)', 'W2 = p.input("W2", H, N, tiles=(8, N // 16))'),
    ("k_tiles=H // 16", "k_tiles=8"),
    ("h_steps, k_steps = H // 64, K // 64", "h_steps, k_steps = 2, K // 64"),
    ("x_cols, w1_cols, w2_cols, y_cols = K // 16, H // 16,", "x_cols, w1_cols, w2_cols, y_cols = K // 16, 8,"),
]

LAYER1_IBW2 = [  # the first matmul reduces K two tiles a step, the second four
    K128,
    ("block=(2, 4, 4))\n    p.elementwise", "block=(2, 4, 2))\n    p.elementwise"),
    ('x_ring = p.ring("X_ring", depth=2, tiles=2 * 4,', 'x_ring = p.ring("X_ring", depth=2, tiles=2 * 2,'),
    ('w1_ring = p.ring("W1_ring", depth=2, tiles=4 * 4,', 'w1_ring = p.ring("W1_ring", depth=2, tiles=2 * 4,'),
    ("h_steps, k_steps = H // 64, K // 64", "h_steps, k_steps = H // 64, K // 32"),
    (X, "page.read(X, 2 * x_cols * item.y + 2 * kk, 2, 2)"),
    (W1, "page.read(W1, 2 * w1_cols * kk + 4 * h, 2, 4)"),
]


def per_site_reader(w1_site1: str) -> list[Edit]:
    """Two sites, one item each, each with a reader of its own; site 1's reads W1 at `w1_site1`."""
    text = MLP.read_text()
    site1 = text[text.index("    @p.reader") : text.index("    @p.compute")]
    site1 = site1.replace("@p.reader\n    def read(", "@p.reader(sites=[1])\n    def read1(")
    site1 = site1.replace("4 * w1_cols * kk + 4 * h,", f"{w1_site1},")
    return [K128, (PLACE, "p.place([[0], [1]])"), ("    @p.reader\n", "    @p.reader(sites=[0])\n"),
            ("    @p.compute", site1 + "    @p.compute")]  # fmt: skip


def int8(*edits: Edit, op: str = "Requant(1 << 30, -12, 0)") -> str:
    """The example in int8 (as tests/lang/test_mlp.py's int8_mlp): the gelu replaced by `op`, int8 layouts."""
    source = edited(('precision="bf16"', 'precision="int8"'), IMPORTS).replace('Activation("gelu_tanh")', op)
    layouts = [
        ('p.input("W1", K, H', 'p.input("W1", K, H, order="col"'),
        ('p.input("W2", H, N', 'p.input("W2", H, N, order="col"'),
        ('"W1_ring", depth=2, tiles=4 * 4, layout="swizzled"', '"W1_ring", depth=2, tiles=4 * 4, layout="col"'),
        ('"W2_ring", depth=2, tiles=4 * 4, layout="swizzled"', '"W2_ring", depth=2, tiles=4 * 4, layout="col"'),
        ('"X_ring", depth=2, tiles=2 * 4, layout="swizzled"', '"X_ring", depth=2, tiles=2 * 4'),
    ]
    return edited(*edits, *layouts, text=source)


# ---- accepted, and equal to the reference ------------------------------------------------------------------------

ACCEPTED: dict[str, list[Edit]] = {
    "the example with two K steps": [K128],
    "W1's columns and W2's rows permuted alike (h + 2·kk)": [
        K128,
        (W1, "page.read(W1, 4 * w1_cols * kk + h, 4, 4, strides=(w1_cols, 2))"),
        (W2, "page.read(W2, w2_cols * h + 4 * item.x, 4, 4, strides=(2 * w2_cols, 1))"),
    ],
    "W1 and W2 both walked backwards over h": [
        K128,
        (W1, "page.read(W1, 4 * w1_cols * kk + 4 * (1 - h), 4, 4)"),
        (W2, "page.read(W2, 4 * w2_cols * (1 - h) + 4 * item.x, 4, 4)"),
    ],
    "acc1 released after the second matmul": [
        K128,
        ("                acc1.release()\n", ""),
        ("                w2.pop()\n", "                w2.pop()\n                acc1.release()\n"),
    ],
    "acc1 re-acquired each h step, released after the h loop": [
        K128,
        ("                acc1.release()\n", ""),
        (
            "            with y_ring.reserve() as page:",
            "            acc1.release()\n            with y_ring.reserve() as page:",
        ),
    ],
    "a relu hidden chain, declared relu": [K128, *hidden_op("Relu()")],
    "a sigmoid hidden chain": hidden_op('Activation("sigmoid")'),
    "two sites, one item each": [K128, (PLACE, "p.place([[0], [1]])")],
    "two sites, a reader each": per_site_reader("4 * w1_cols * kk + 4 * h"),
    "the hidden ring column-major": [K128, (HIDDEN, HIDDEN[:-1] + ', layout="col")')],
    "the hidden ring swizzled": [K128, (HIDDEN, HIDDEN[:-1] + ', layout="swizzled")')],
    "the hidden ring a fifo": [K128, (HIDDEN, 'hidden = p.ring("hidden", depth=1, tiles=2 * 4)')],
    "the hidden ring's pages larger than the block": [K128, (HIDDEN, HIDDEN.replace("2 * 4", "4 * 4"))],
    "fp16": [K128, ('precision="bf16"', 'precision="fp16"')],
    "every hidden page first, then the second matmul (ring two deep)": two_loops(),
    "a bias in the hidden chain at its own columns (H = N)": hidden_bias("4 * h"),
    "no chain: the second matmul multiplies the packed sums": [
        K128,
        ("    " + GELU_STAGE + "\n", ""),
        ('p.matmul("layer2", hidden,', 'p.matmul("layer2", sums,'),
        ("                with sums.wait() as s, hidden.reserve() as g:\n                    " + GELU + "\n", ""),
        ("g, w2 = hidden.wait(), w2_ring.wait()", "g, w2 = sums.wait(), w2_ring.wait()"),
        (HIDDEN, "pass"),
    ],
    "a chain of two: gelu, then × 3": chain_of_two('Activation("gelu_tanh")', 'Scalar("mul", 3.0)'),
    "eight items on one site (M = N = 128)": [(SIZES, "M, K, H, N = 128, 128, 128, 128")],
    "four h steps (H = 256)": [(SIZES, "M, K, H, N = 64, 128, 256, 64")],
    "three K steps, three h steps": [(SIZES, "M, K, H, N = 64, 192, 192, 64")],
    "a padded hidden width (H = 96 in 8 tiles), gelu": PADDED_H,
    "a padded hidden width (H = 96 in 8 tiles), sigmoid (chain(0) = 1/2)": [
        *PADDED_H,
        *hidden_op('Activation("sigmoid")'),
    ],
    "the first matmul two K tiles a step, the second four": LAYER1_IBW2,
}


@pytest.mark.parametrize("edits", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_and_equal_to_the_reference(edits):
    assert_exact(edited(*edits))


@pytest.mark.parametrize(
    "source",
    [int8(), int8(op="Requant(1 << 30, -12, 5)"), int8(*PADDED_H, op="Requant(1 << 30, -12, 7)")],
    ids=["int8", "int8, zero point 5", "int8, padded hidden width, zero point 7"],
)
def test_an_int8_mlp_is_accepted_and_exact(source):
    assert_exact(source)


# ---- refused, by name ----------------------------------------------------------------------------------------------

REFUSED: dict[str, tuple[list[Edit], type[Exception], str]] = {
    "W1's k and h swapped": (
        [K128, (W1, "page.read(W1, 4 * w1_cols * h + 4 * kk, 4, 4)")],
        SemanticError,
        "in its operand A of stage layer2 sums tiles of W1 column 4, not 0",
    ),
    "W1 stepping 2 tiles an h step": (
        [K128, (W1, "page.read(W1, 4 * w1_cols * kk + 2 * h, 4, 4)")],
        SemanticError,
        "sums tiles of W1 column 2, not 4",
    ),
    "W1 without its K step": (
        [K128, (W1, "page.read(W1, 4 * h, 4, 4)")],
        SemanticError,
        "in its operand A of stage layer2 multiplies A's k-tile 4 by B's k-tile 0",
    ),
    "X's columns following h, not k": (
        [K128, (X, "page.read(X, 2 * x_cols * item.y + 4 * h, 2, 4)")],
        SemanticError,
        "multiplies A's k-tile 0 by B's k-tile 4",
    ),
    "W1's columns permuted, W2's rows not": (
        [K128, (W1, "page.read(W1, 4 * w1_cols * kk + h, 4, 4, strides=(w1_cols, 2))")],
        SemanticError,
        "sums tiles of W1 column 2, not 1",
    ),
    "W2's rows walked backwards over h, W1's not": (
        [K128, (W2, "page.read(W2, 4 * w2_cols * (1 - h) + 4 * item.x, 4, 4)")],
        SemanticError,
        "sums tiles of W1 column 0, not 4",
    ),
    "every hidden page first, W2 backwards": (
        two_loops("4 * w2_cols * (1 - h) + 4 * item.x"),
        SemanticError,
        "sums tiles of W1 column 0, not 4",
    ),
    "acc1 acquired outside the h loop (summing across h steps)": (
        [
            K128,
            (
                '            acc2.acquire()\n            for _ in e.range(h_steps, "h"):\n'
                "                acc1.acquire()",
                '            acc2.acquire()\n            acc1.acquire()\n            for _ in e.range(h_steps, "h"):',
            ),
        ],
        SemanticError,
        "it reads a partial sum",
    ),
    "acc2 acquired outside the item loop (summing across items)": (
        [
            K128,
            (
                "        for _ in e.items():\n            acc2.acquire()",
                "        acc2.acquire()\n        for _ in e.items():",
            ),
        ],
        SemanticError,
        "it reads a partial sum",
    ),
    "a relu scheduled where the stage declares gelu": (
        [K128, IMPORTS, (GELU, "e.compute(Relu(), s, g)")],
        SemanticError,
        "schedule op relu where stage gelu declares gelu",
    ),
    "acc1 packed one row of two (tiles=4)": (
        [K128, ("acc1.pack(page)", "acc1.pack(page, tiles=4)")],
        StrongerCheckNeeded,
        "it multiplies 2x4 tiles of a page of 1 rows of 4",
    ),
    "acc2 packed one row of two (tiles=4)": (
        [K128, ("acc2.pack(page)", "acc2.pack(page, tiles=4)")],
        StrongerCheckNeeded,
        "it writes 2x4 tiles from a page of 1 rows of 4 tiles",
    ),
    "two hidden pages per h step, both multiplied": (
        twice_per_h(),
        SemanticError,
        "Y tile (0, 0) sums k-tiles 0..7 (16 products) of 0..7; K needs 0..7 each exactly once",
    ),
    "the hidden bias at column 0 whatever the h step": (
        hidden_bias("0"),
        SemanticError,
        "in its operand A of stage layer2 gets bias tile column 0, not its own column 4",
    ),
    "the hidden bias at the item's columns": (
        hidden_bias("4 * item.x"),
        SemanticError,
        "gets bias tile column 4, not its own column 0",
    ),
    "the hidden bias one tile off": (hidden_bias("4 * h + 1"), TileBoundsError, "outside its 1x8 tile grid"),
    "the chain's two ops swapped": (
        chain_of_two('Scalar("mul", 3.0)', 'Activation("gelu_tanh")'),
        SemanticError,
        "schedule op mul 3 where stage gelu declares gelu",
    ),
    "the chain's constant wrong": (
        chain_of_two('Activation("gelu_tanh")', 'Scalar("mul", 3.5)'),
        SemanticError,
        "schedule op mul 3.5 where stage scale declares mul 3",
    ),
    "the chain's scalar an add": (
        chain_of_two('Activation("gelu_tanh")', 'Scalar("add", 3.0)'),
        SemanticError,
        "schedule op add 3 where stage scale declares mul 3",
    ),
    "a hidden width of 4.5 tiles (H = 72)": (
        [(SIZES, "M, K, H, N = 64, 64, 72, 64")],
        StrongerCheckNeeded,
        "computed operand A reduces 72 elements, not a whole number of 16-element tiles",
    ),
    "a hidden width not a whole number of steps (H = 96, unpadded)": (
        [(SIZES, "M, K, H, N = 64, 64, 96, 64")],
        IllFormedError,
        "not a whole number of K steps",
    ),
    "site 1's reader walks W1 backwards": (
        per_site_reader("4 * w1_cols * kk + 4 * (1 - h)"),
        SemanticError,
        "site 1 writer",
    ),
    "the first matmul's X one tile off": (
        [
            *LAYER1_IBW2,
            (
                "page.read(X, 2 * x_cols * item.y + 2 * kk, 2, 2)",
                "page.read(X, 2 * x_cols * item.y + 2 * kk + 1, 2, 2)",
            ),
        ],
        TileBoundsError,
        "outside its 4x8 tile grid",
    ),  # fmt: skip
    "the second matmul reads the front of two waited hidden pages twice": (
        [
            K128,
            DEEP_HIDDEN,
            (LAYER2, LAYER2[: LAYER2.index("                g, w2")]),
            (
                "            with y_ring.reserve() as page:\n                acc2.pack",
                "            g = hidden.wait(2)\n"
                '            for _ in e.range(h_steps, "h3"):\n'
                "                w2 = w2_ring.wait()\n"
                "                acc2.matmul(layer2, g, w2)\n"
                "                w2.pop()\n"
                "            g.pop()\n"
                "            with y_ring.reserve() as page:\n                acc2.pack",
            ),
            (READ_W2, ""),
            (
                "                        page.read(W1, 4 * w1_cols * kk + 4 * h, 4, 4)\n",
                "                        page.read(W1, 4 * w1_cols * kk + 4 * h, 4, 4)\n"
                '            for h3 in e.range(h_steps, "h3"):\n'
                "                with w2_ring.reserve() as page:\n"
                "                    page.read(W2, 4 * w2_cols * h3 + 4 * item.x, 4, 4)\n",
            ),
        ],
        StrongerCheckNeeded,
        "no op fills a page of it at that position",
    ),  # fmt: skip
}


@pytest.mark.parametrize(("edits", "error", "says"), REFUSED.values(), ids=REFUSED.keys())
def test_refused_with_the_fault_named(edits, error, says):
    assert_refused(edited(*edits), error, says)


def test_an_int8_hidden_chain_not_ending_in_a_requant_is_refused():
    """A relu after the requant keeps int8 values, yet is refused: the rule asks for a requant last (documented)."""
    source = int8(
        ('p.elementwise("gelu", Requant(1 << 30, -12, 0), sums, hidden)',
         'mid = p.ring("mid", depth=1, tiles=8, kind="interm")\n'
         '    p.elementwise("rq", Requant(1 << 30, -12, 0), sums, mid)\n'
         '    p.elementwise("relu", Relu(), mid, hidden)'),
        ("                with sums.wait() as s, hidden.reserve() as g:\n"
         "                    e.compute(Requant(1 << 30, -12, 0), s, g)",
         "                with sums.wait() as s, mid.reserve() as m:\n"
         "                    e.compute(Requant(1 << 30, -12, 0), s, m)\n"
         "                with mid.wait() as m, hidden.reserve() as g:\n"
         "                    e.compute(Relu(), m, g)"),
    )  # fmt: skip
    assert_refused(source, SemanticError, "computed operand A is not requantised to int8 last")


# ---- three layers: Y = tanh(gelu(X @ W1) @ W2) @ W3 ------------------------------------------------------------

THREE = """
from spatialc import lang
from spatialc.ir.ops import Activation

M, K, H1, H2, N = 64, 64, 128, 128, 64


@lang.program(target="sm_90", precision="bf16")
def mlp(p: lang.Builder):
    X, W1 = p.input("X", M, K), p.input("W1", K, H1)
    W2, W3 = p.input("W2", H1, H2), p.input("W3", H2, N)
    Y = p.output("Y", M, N)
    x_ring = p.ring("X_ring", depth=2, tiles=8, layout="swizzled")
    w1_ring = p.ring("W1_ring", depth=2, tiles=16, layout="swizzled")
    w2_ring = p.ring("W2_ring", depth=2, tiles=16, layout="swizzled")
    w3_ring = p.ring("W3_ring", depth=2, tiles=16, layout="swizzled")
    acc1, acc2, acc3 = (p.accumulator(f"acc{i}", tiles=8) for i in (1, 2, 3))
    s1, g1, s2, g2 = (p.ring(n, depth=1, tiles=8, kind="interm") for n in ("s1", "g1", "s2", "g2"))
    y_ring = p.ring("Y_ring", depth=2, tiles=8)
    for name, t, r in (("read_X", X, x_ring), ("read_W1", W1, w1_ring), ("read_W2", W2, w2_ring),
                       ("read_W3", W3, w3_ring)):
        p.read(name, t, r)
    layer1 = p.matmul("layer1", x_ring, w1_ring, s1, block=(2, 4, 4))
    p.elementwise("gelu1", Activation("gelu_tanh"), s1, g1)
    layer2 = p.matmul("layer2", g1, w2_ring, s2, block=(2, 4, 4))
    p.elementwise("act2", Activation("tanh"), s2, g2)
    layer3 = p.matmul("layer3", g2, w3_ring, y_ring, block=(2, 4, 4))
    p.write("write_Y", y_ring, Y)
    grid = (M // 32, N // 64)
    p.plan(block=(2, 4, 4), grid=grid, k_tiles=H2 // 16, depth=2)
    p.place([list(range(grid[0] * grid[1]))])
    xc, w1c, w2c, w3c, yc = K // 16, H1 // 16, H2 // 16, N // 16, N // 16

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for b in e.range(H2 // 64, "b"):
                for a in e.range(H1 // 64, "a"):
                    for kk in e.range(K // 64, "k"):
                        with x_ring.reserve() as page:
                            page.read(X, 2 * xc * item.y + 4 * kk, 2, 4)
                        with w1_ring.reserve() as page:
                            page.read(W1, 4 * w1c * kk + 4 * a, 4, 4)
                    with w2_ring.reserve() as page:
                        page.read(W2, 4 * w2c * a + 4 * b, 4, 4)
                with w3_ring.reserve() as page:
                    page.read(W3, 4 * w3c * b + 4 * item.x, 4, 4)

    @p.compute
    def multiply(e: lang.Engine):
        for _ in e.items():
            acc3.acquire()
            for _ in e.range(H2 // 64, "b"):
                acc2.acquire()
                for _ in e.range(H1 // 64, "a"):
                    acc1.acquire()
                    for _ in e.range(K // 64, "k"):
                        x, w1 = x_ring.wait(), w1_ring.wait()
                        acc1.matmul(layer1, x, w1)
                        x.pop()
                        w1.pop()
                    with s1.reserve() as page:
                        acc1.pack(page)
                    acc1.release()
                    with s1.wait() as s, g1.reserve() as g:
                        e.compute(Activation("gelu_tanh"), s, g)
                    g, w2 = g1.wait(), w2_ring.wait()
                    acc2.matmul(layer2, g, w2)
                    g.pop()
                    w2.pop()
                with s2.reserve() as page:
                    acc2.pack(page)
                acc2.release()
                with s2.wait() as s, g2.reserve() as g:
                    e.compute(Activation("tanh"), s, g)
                g, w3 = g2.wait(), w3_ring.wait()
                acc3.matmul(layer3, g, w3)
                g.pop()
                w3.pop()
            with y_ring.reserve() as page:
                acc3.pack(page)
            acc3.release()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with y_ring.wait() as page:
                page.write(Y, 2 * yc * item.y + 4 * item.x, 2, 4)
"""


def test_a_three_layer_mlp_is_accepted_and_exact():
    assert_exact(THREE)


@pytest.mark.parametrize(
    ("old", "new", "error", "says"),
    [
        ("page.read(W2, 4 * w2c * a + 4 * b, 4, 4)", "page.read(W2, 4 * w2c * a, 4, 4)", SemanticError,
         "in its operand A of stage layer3 multiplies W2's tile column 0, not 4"),
        ("page.read(W2, 4 * w2c * a + 4 * b, 4, 4)", "page.read(W2, 4 * w2c * b + 4 * a, 4, 4)", SemanticError,
         "in its operand A of stage layer3: the k-tiles it sums move with"),
        ("page.read(W1, 4 * w1c * kk + 4 * a, 4, 4)", "page.read(W1, 4 * w1c * kk + 4 * b, 4, 4)", SemanticError,
         "in its operand A of stage layer3, in its operand A of stage layer2 sums tiles of W1 column 4, not 0"),
        ('e.compute(Activation("tanh"), s, g)', 'e.compute(Activation("sigmoid"), s, g)', SemanticError,
         "schedule op sigmoid where stage act2 declares tanh"),
    ],
    ids=["W2's columns fixed", "W2's rows and columns swapped", "W1's columns follow the outer step",
         "the middle activation wrong"],
)  # fmt: skip
def test_a_wrong_three_layer_mlp_is_refused(old, new, error, says):
    assert_refused(edited((old, new), text=THREE), error, says)


# ---- the computed operand as B: Y = P @ gelu(X @ W1) -------------------------------------------------------------

HIDDEN_B = """
from spatialc import lang
from spatialc.ir.ops import Activation

Q, M, K, H = 64, 128, 64, 128


@lang.program(target="sm_90", precision="bf16")
def mlp(p: lang.Builder):
    X, W1, P = p.input("X", M, K), p.input("W1", K, H), p.input("P", Q, M)
    Y = p.output("Y", Q, H)
    x_ring = p.ring("X_ring", depth=2, tiles=4 * 4, layout="swizzled")
    w1_ring = p.ring("W1_ring", depth=2, tiles=4 * 4, layout="swizzled")
    p_ring = p.ring("P_ring", depth=2, tiles=2 * 4, layout="swizzled")
    acc1, acc2 = p.accumulator("acc1", tiles=4 * 4), p.accumulator("acc2", tiles=2 * 4)
    sums = p.ring("sums", depth=1, tiles=4 * 4, kind="interm")
    hidden = p.ring("hidden", depth=1, tiles=4 * 4, kind="interm")
    y_ring = p.ring("Y_ring", depth=2, tiles=2 * 4)
    p.read("read_X", X, x_ring)
    p.read("read_W1", W1, w1_ring)
    p.read("read_P", P, p_ring)
    layer1 = p.matmul("layer1", x_ring, w1_ring, sums, block=(4, 4, 4))
    p.elementwise("gelu", Activation("gelu_tanh"), sums, hidden)
    layer2 = p.matmul("layer2", p_ring, hidden, y_ring, block=(2, 4, 4))
    p.write("write_Y", y_ring, Y)
    grid = (Q // 32, H // 64)
    p.plan(block=(2, 4, 4), grid=grid, k_tiles=M // 16, depth=2)
    p.place([list(range(grid[0] * grid[1]))])
    x_cols, w1_cols, p_cols, y_cols = K // 16, H // 16, M // 16, H // 16

    @p.reader
    def read(e: lang.Engine):
        for item in e.items():
            for m in e.range(M // 64, "m"):
                for kk in e.range(K // 64, "k"):
                    with x_ring.reserve() as page:
                        page.read(X, 4 * x_cols * m + 4 * kk, 4, 4)
                    with w1_ring.reserve() as page:
                        page.read(W1, 4 * w1_cols * kk + 4 * item.x, 4, 4)
                with p_ring.reserve() as page:
                    page.read(P, 2 * p_cols * item.y + 4 * m, 2, 4)

    @p.compute
    def multiply(e: lang.Engine):
        for _ in e.items():
            acc2.acquire()
            for _ in e.range(M // 64, "m"):
                acc1.acquire()
                for _ in e.range(K // 64, "k"):
                    x, w1 = x_ring.wait(), w1_ring.wait()
                    acc1.matmul(layer1, x, w1)
                    x.pop()
                    w1.pop()
                with sums.reserve() as page:
                    acc1.pack(page)
                acc1.release()
                with sums.wait() as s, hidden.reserve() as g:
                    e.compute(Activation("gelu_tanh"), s, g)
                pp, g = p_ring.wait(), hidden.wait()
                acc2.matmul(layer2, pp, g)
                pp.pop()
                g.pop()
            with y_ring.reserve() as page:
                acc2.pack(page)
            acc2.release()

    @p.writer
    def write(e: lang.Engine):
        for item in e.items():
            with y_ring.wait() as page:
                page.write(Y, 2 * y_cols * item.y + 4 * item.x, 2, 4)
"""


def test_a_computed_operand_b_is_accepted_and_exact():
    assert_exact(HIDDEN_B)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("page.read(X, 4 * x_cols * m + 4 * kk, 4, 4)", "page.read(X, 4 * kk, 4, 4)",
         "in its operand B of stage layer2 sums tiles of X row 0, not 4"),
        ("page.read(W1, 4 * w1_cols * kk + 4 * item.x, 4, 4)", "page.read(W1, 4 * w1_cols * kk, 4, 4)",
         "in its operand B of stage layer2 sums tiles of W1 column 0, not 4"),
        ("page.read(P, 2 * p_cols * item.y + 4 * m, 2, 4)", "page.read(P, 2 * p_cols * item.y + 4 * (1 - m), 2, 4)",
         "in its operand B of stage layer2 sums tiles of X row 0, not 4"),
    ],
    ids=["X's rows fixed", "W1's columns fixed", "P's columns walked backwards"],
)  # fmt: skip
def test_a_wrong_computed_operand_b_is_refused(old, new, says):
    assert_refused(edited((old, new), text=HIDDEN_B), SemanticError, says)


def test_a_computed_operand_b_given_as_a_is_refused_where_it_is_traced():
    source = edited(("acc2.matmul(layer2, pp, g)", "acc2.matmul(layer2, g, pp)"), text=HIDDEN_B)
    assert_refused(source, lang.LangError, "stage layer2 multiplies pages of P_ring and hidden; these are of hidden")


# ---- holes the review found (fixed) -----------------------------------------------------------------------------


def test_a_hidden_bias_wider_than_the_hidden_layer_is_refused():
    source = edited(*hidden_bias("4 * h", "M, K, H, N = 64, 128, 64, 128", width="N"))
    assert_refused(source, SemanticError, "stage bias1 adds B1, a row of 128 values, to values 64 columns wide")


def test_a_hidden_bias_as_wide_as_the_hidden_layer_is_accepted():
    assert_exact(edited(*hidden_bias("4 * h", "M, K, H, N = 64, 128, 128, 64", width="H")))


def test_a_padded_computed_operand_whose_chain_of_zero_overflows_is_refused():
    # The hidden padding tiles hold fp16(0 + 65520) = inf, and inf × W2's zero padding would be NaN: a sum over
    # them is refused (the same program with gelu, whose chain(0) is 0, is accepted above).
    source = edited(*PADDED_H, *hidden_op('Scalar("add", 65520.0)', "fp16"))
    assert_refused(source, SemanticError, "sums k-tiles 0..7 (8 products) of 0..5; K needs 0..5 each exactly once")
