"""Grouped GEMM with row counts known only at run time (a mixture-of-experts layer): C[g, :m_g] = epilogue(A[g, :m_g]
@ B[g]), the counts m_g in the int32 tensor `sizes`.

Through every layer: the frontend and its refusals, the plan over strips (a group and a column of items), the
schedule's loops counted at run time, rule 8's proof that those loops and the masked rows leave exactly the rows the
counts ask for (and its refusals of edits that break it), the interpreter, the general form under emulation and
nvcc, the launcher's stacked tensors, the CLI, and out-of-range counts refused by evaluate, emulate and run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

import spatialc
from spatialc.errors import ProgramError, SemanticError, SpatialError, VerifyError
from spatialc.inputs import InputError
from spatialc.ir import serde
from spatialc.ir.ids import LV_ITEM_X, LV_ROW
from spatialc.ir.nodes import Engine
from spatialc.ir.ops import Loop, ReadTiles, Trip, WriteTiles
from spatialc.passes.verify import verify
from spatialc.runtime import launch as L

from .rewrite import edit, map_ops
from .test_split_k import compile_clean, split_device

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def operands(prec: str, groups: int, rows: int, n: int, k: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if prec == "int8":
        a = rng.integers(-128, 128, (groups, rows, k)).astype(np.int8)
        b = rng.integers(-128, 128, (groups, k, n)).astype(np.int8)
    else:  # small integers: every sum order adds them exactly
        a = rng.integers(-4, 5, (groups, rows, k)).astype(np.float64)
        b = rng.integers(-4, 5, (groups, k, n)).astype(np.float64)
    return {"A": a, "B": b, "sizes": rng.integers(0, rows + 1, groups).astype(np.int32)}


def reference(ins: dict[str, np.ndarray]) -> np.ndarray:
    a, b = ins["A"].astype(np.float64), ins["B"].astype(np.float64)
    c = a @ b
    for g, m in enumerate(ins["sizes"]):
        c[g, m:] = 0
    return c


def grouped(groups=4, rows=100, n=64, k=48, prec="int8", tgt="sm_86", **kw):
    build = {key: kw.pop(key) for key in ("sites", "placement", "block", "sub_blocks", "depth") if key in kw}
    return spatialc.build(spatialc.grouped_gemm(groups, rows, n, k, prec, **kw), tgt, **build)


# ---- building and evaluating ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prec", "groups", "rows", "n", "k", "tgt", "kw"),
    [
        ("int8", 4, 100, 64, 48, "sm_86", {}),
        ("int8", 3, 17, 40, 70, "sm_90", {"sites": 2}),
        ("fp16", 8, 64, 32, 32, "sm_80", {}),
        ("bf16", 5, 130, 50, 33, "sm_86", {"sites": 3, "placement": "round_robin"}),
    ],
)
def test_a_grouped_gemm_verifies_and_evaluates_exactly(prec, groups, rows, n, k, tgt, kw):
    p = grouped(groups, rows, n, k, prec, tgt, **kw)
    assert p.verified
    plan = p.plan
    assert plan.groups == groups
    for seed in range(3):
        ins = operands(prec, groups, rows, n, k, seed)
        if seed == 1:
            ins["sizes"][:] = rows  # every group full
        if seed == 2:
            ins["sizes"][:] = 0  # none
        assert np.array_equal(spatialc.evaluate(p, ins), reference(ins))


def test_a_grouped_epilogue_runs_on_each_groups_rows_and_leaves_the_rest_zero():
    p = grouped(3, 50, 40, 70, "int8", epilogue=[spatialc.bias(), spatialc.relu(), spatialc.requant(0.01, 7)])
    ins = operands("int8", 3, 50, 40, 70, 5) | {"bias": np.arange(40, dtype=np.int32) * 1000}
    ins["sizes"] = np.array([50, 0, 33], np.int32)
    got = spatialc.evaluate(p, ins)
    assert got.dtype == np.int8
    assert not got[1].any() and not got[2, 33:].any()  # rows past the counts: zeros (the zero point is not added)
    assert spatialc.tolerance(p).check(got, ins)[0]


def test_the_schedule_counts_each_groups_row_blocks_at_run_time():
    p = grouped(4, 100, 64, 48)
    h = p.plan.item_tiles[0]
    for q in p.schedule.programs:
        if not q.ops:
            continue
        (row,) = [op for op in q.ops if isinstance(op, Loop)] or [
            op for lp in q.ops for op in lp.body if isinstance(op, Loop) and op.var == LV_ROW
        ]
        assert row.var == LV_ROW and isinstance(row.count, Trip)
        assert row.count.per == h * 16 and row.count.bound == p.plan.grid[0]
    reads = [op for q in p.schedule.programs for op in spatialc.ir.ops.walk(q.ops) if isinstance(op, ReadTiles)]
    a, b = p.tensor_named("A").id, p.tensor_named("B").id
    assert all(op.rows_from is not None for op in reads if op.tensor == a)  # A's rows past the count: not read
    assert all(op.rows_from is None for op in reads if op.tensor == b)  # B's rows are K: all read


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((0, 10, 16, 16), "groups must be a whole number"),
        ((1, 10, 16, 16), "at least 2 groups"),  # one group has no row counts: spatialc.gemm
        ((2**17, 10, 16, 16), "at most 65536"),
        ((4, 0, 16, 16), "max_rows must be a whole number"),
    ],
)
def test_a_grouped_gemm_it_cannot_make_is_one_clear_error(args, words):
    with pytest.raises(ProgramError, match=words):
        spatialc.grouped_gemm(*args)


def test_a_bias_named_like_the_row_counts_and_split_k_are_refused():
    with pytest.raises(ProgramError, match="row counts are the tensor 'sizes'"):
        spatialc.grouped_gemm(2, 16, 16, 16, epilogue=[spatialc.bias("sizes")])
    with pytest.raises(ProgramError, match="not split"):
        spatialc.build(spatialc.grouped_gemm(2, 16, 16, 4096), split_k=2)


@pytest.mark.parametrize(
    ("sizes", "words"),
    [
        ([0, 101, 3, 4], "group 1 has 101 rows"),
        ([-1, 1, 3, 4], "group 0 has -1 rows"),
        ([1.5, 1, 3, 4], "whole numbers"),
        ([1, 2, 3], "expected 4 values, got 3"),
    ],
)
def test_row_counts_out_of_range_are_refused_by_evaluate(sizes, words):
    p = grouped(4, 100, 64, 48)
    ins = operands("int8", 4, 100, 64, 48) | {"sizes": np.array(sizes)}
    with pytest.raises(InputError) as info:
        spatialc.evaluate(p, ins)
    assert words in str(info.value)


# ---- verify: what it must refuse --------------------------------------------------------------------------------


def retrip(p, engine, f):
    """`p` with the Trip of `engine`'s row loop replaced by f(trip)."""

    def swap(op):
        if isinstance(op, Loop) and op.var == LV_ROW:
            return (dataclasses.replace(op, count=f(op.count)),)
        return None

    return edit(p.evolve(verified=False), engine, lambda ops: map_ops(ops, swap))


def test_planted_faults_in_the_row_counting_are_refused():
    p = grouped(4, 100, 64, 48)
    refuse = lambda q, *words: _refused(q, *words)  # noqa: E731
    # every row written, whatever the count
    unmasked = edit(
        p.evolve(verified=False),
        Engine.WRITER,
        lambda ops: map_ops(
            ops, lambda op: (dataclasses.replace(op, rows_from=None),) if isinstance(op, WriteTiles) else None
        ),
    )
    refuse(unmasked, "writes every row")
    # blocks counted in the wrong unit: fewer rows per block than a block holds, or more
    for per in (16, p.plan.item_tiles[0] * 32):
        refuse(_all_engines(p, lambda t, per=per: dataclasses.replace(t, per=per)), "must be")
    # the loop may stop short of the group's rows
    refuse(_all_engines(p, lambda t: dataclasses.replace(t, bound=t.bound - 1)), "never written")
    # the count read for another group than the one written
    refuse(_all_engines(p, lambda t: dataclasses.replace(t, steps=((LV_ITEM_X, 1),))), "counts rows of group")
    # one engine's loop counted differently from the others': its ring balances for some counts only
    with pytest.raises(SpatialError):
        verify(retrip(p, Engine.WRITER, lambda t: dataclasses.replace(t, per=t.per * 2)))


def _all_engines(p, f):
    q = p
    for engine in Engine:
        q = retrip(q, engine, f)
    return q


def _refused(q, *words):
    with pytest.raises(VerifyError) as info:
        verify(q)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value}"


def test_every_grouped_edit_is_refused_or_still_right():
    """The mutation suite of the run-time rows: the row loop's count, the masks, the group strides — each changed in
    one engine or all; verify must refuse it, or it must still compute the grouped product on drawn row counts."""
    p = grouped(3, 40, 32, 48, "int8", sites=2)
    draws = [operands("int8", 3, 40, 32, 48, s) for s in range(3)]
    wants = [reference(ins) for ins in draws]
    edits = []
    for field, values in (("per", (16, 32, 48, 64)), ("bound", (1, 2, 4)), ("index", (1,))):
        for v in values:
            for engines in ((Engine.READER,), (Engine.WRITER,), tuple(Engine)):
                edits.append((f"{field}={v} in {[e.value for e in engines]}", field, v, engines))
    accepted = 0
    for name, field, v, engines in edits:
        q = p
        for e in engines:
            q = retrip(q, e, lambda t, field=field, v=v: dataclasses.replace(t, **{field: v}))
        try:
            v_q = verify(q)
        except SpatialError:
            continue
        accepted += 1
        for ins, want in zip(draws, wants, strict=True):
            assert np.array_equal(spatialc.evaluate(v_q, ins), want), name
    # dropping one op's mask: the A read (its rows past the count would be read) or the C write: both refused
    for kind in (ReadTiles, WriteTiles):
        q = edit(
            p.evolve(verified=False),
            Engine.READER if kind is ReadTiles else Engine.WRITER,
            lambda ops, kind=kind: map_ops(
                ops,
                lambda op: (
                    (dataclasses.replace(op, rows_from=None),) if isinstance(op, kind) and op.rows_from else None
                ),
            ),
        )
        with pytest.raises(SemanticError):
            verify(q)
    assert accepted < len(edits) // 3


def test_a_saved_grouped_program_loads_verified():
    p = grouped(3, 40, 32, 48)
    doc = json.loads(spatialc.to_json(p))
    assert doc["version"] == serde.VERSION and doc["program"]["plans"][0]["groups"] == 3
    again = spatialc.from_json(json.dumps(doc))
    assert again == p and again.verified


# ---- lowering and running ---------------------------------------------------------------------------------------


def test_grouped_programs_lower_to_the_general_form_with_their_counts_in_the_launch():
    p = grouped(4, 100, 64, 48)
    art = spatialc.lower(p)
    assert art.budget.form == "general" and "trip count is read from data" in art.notes[0]
    assert dict(art.launch.row_counts) == {"sizes": 100}
    groups = {q.name: q.groups for q in art.launch.params}
    assert groups == {"A": 4, "B": 4, "C": 4, "sizes": 1}
    assert "spatialc_trip_per(" in art.kernel_cu and "keep ? 0 : 16" in art.kernel_cu
    assert re.search(r"if \(\(\(tile / \d+\) % \d+\) \* 16 \+ el / 16 < t3\[", art.kernel_cu)  # the masked store
    assert "spatialc_count_out(h3, 100)" in art.program_cu


def test_the_launcher_stacks_each_groups_tiles_and_refuses_bad_counts():
    p = grouped(3, 40, 32, 48)
    art = spatialc.lower(p)
    ins = operands("int8", 3, 40, 32, 48, 1)
    c = L.run_with(split_device(art), art, ins["A"], ins["B"], sizes=ins["sizes"])  # C = A @ B group by group
    full = ins["A"].astype(np.int64) @ ins["B"].astype(np.int64)  # the stand-in writes every row
    assert c.shape == (3, 40, 32) and np.array_equal(c, full)
    with pytest.raises(InputError, match="group 0 has 41 rows"):
        L.run_with(split_device(art), art, ins["A"], ins["B"], sizes=np.array([41, 0, 0]))


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize(
    ("prec", "groups", "rows", "n", "k", "tgt", "kw"),
    [
        ("int8", 4, 100, 64, 48, "sm_86", {}),
        ("fp16", 3, 40, 32, 70, "sm_86", {"sites": 2, "epilogue": [spatialc.bias(), spatialc.relu()]}),
        ("bf16", 5, 33, 17, 50, "sm_89", {"sites": 3}),
    ],
)
def test_the_general_form_under_emulation_equals_the_interpreter(prec, groups, rows, n, k, tgt, kw):
    p = grouped(groups, rows, n, k, prec, tgt, **kw)
    art = spatialc.lower(p)
    for seed in range(2):
        ins = operands(prec, groups, rows, n, k, seed)
        if "epilogue" in kw:
            ins["bias"] = np.arange(n, dtype=np.float32) - n / 2
        assert np.array_equal(spatialc.emulate(art, ins), spatialc.evaluate(p, ins))
    with pytest.raises(InputError, match="rows; each group's row count"):
        spatialc.emulate(art, ins | {"sizes": np.full(groups, rows + 1)})


@emulation
@pytest.mark.emulation
def test_program_cu_itself_refuses_a_row_count_past_max_rows():
    """The printed host program checks the counts it reads (p3.txt) before launching: one line, exit status 1."""
    from spatialc.runtime.emulate import EmulationFault, emulate_source

    p = grouped(3, 40, 32, 48)
    ins = operands("int8", 3, 40, 32, 48)
    files = {"a.txt": ins["A"], "b.txt": ins["B"], "p3.txt": np.array([3, 41, 0])}
    with pytest.raises(EmulationFault) as info:
        emulate_source(spatialc.lower(p).program_cu, files, (3, 40, 32), np.int32)
    assert "tensor sizes: group 1 has 41 rows; each group's row count lies in 0..40" in str(info.value)


NVCC = shutil.which("nvcc")


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_grouped_kernels_compile_without_a_warning_or_a_spill(tmp_path):
    compile_clean(
        tmp_path,
        [
            grouped(8, 100, 64, 48, "bf16", "sm_90"),
            grouped(4, 40, 32, 70, "int8", "sm_80", sites=2),
            grouped(3, 33, 17, 50, "fp16", "sm_86", epilogue=[spatialc.bias()]),
        ],
        host=2,  # the grouped host code (each group's row count), with a bias operand too; the others -cubin
    )


# ---- the command line ----------------------------------------------------------------------------------------


def test_the_cli_runs_a_grouped_gemm_and_refuses_bad_sizes(capsys):
    from spatialc.cli import main

    assert main(["grouped-gemm", "3", "40", "32", "48", "--sizes", "40,0,17", "--target", "sm_86"]) == 0
    out = capsys.readouterr().out
    assert (
        "sizes     40, 0, 17 (57 rows in all, of 120)" in out and "check     interpreter vs numpy reference: OK" in out
    )
    for sizes, words in (
        ("1,2", "gives 2 row counts for 3 groups"),
        ("1,2,41", "group 2 has 41 rows"),
        ("a", "--sizes"),
        ("1,99999999999999999999,1", "a row count of 99999999999999999999 is past what an int32 holds"),
    ):
        assert main(["grouped-gemm", "3", "40", "32", "48", "--sizes", sizes]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_a_grouped_gemm_is_planned_for_the_general_form_and_sized_per_group():
    """Its rows are counted at run time, which only the general form prints: the plan is made for it (a persistent
    plan would not fit its rings), and forcing the persistent form is one clear error. Sizes are checked per
    tensor: groups × rows × columns."""
    p = spatialc.build(spatialc.grouped_gemm(8, 4096, 4096, 4096, "bf16", out="bf16"), "sm_90")
    assert spatialc.lower(p).budget.form == "general"
    with pytest.raises(ProgramError, match="form='general' or 'auto'"):
        spatialc.build(spatialc.grouped_gemm(2, 64, 64, 64), "sm_90", form="persistent")
    with pytest.raises(ProgramError, match="A would be 65536x512x1024"):
        spatialc.grouped_gemm(65536, 512, 16, 1024)


@emulation
@pytest.mark.emulation
def test_the_kernel_itself_flags_a_count_past_max_rows_that_the_host_let_through():
    """With the host's check taken out of program_cu, a count of 101 for 100 rows (still within the loop's bound of
    whole blocks) is flagged by the kernel: its loop runs no times and the host reports it."""
    from spatialc.runtime.emulate import EmulationFault, emulate_source

    p = grouped(3, 100, 32, 48)
    text = spatialc.lower(p).program_cu
    assert "spatialc_count_out(h3, 100)" in text
    text = text.replace("spatialc_count_out(h3, 100)", "-1LL")
    ins = operands("int8", 3, 100, 32, 48)
    files = {"a.txt": ins["A"], "b.txt": ins["B"], "p3.txt": np.array([3, 101, 0])}
    with pytest.raises(EmulationFault, match="a loop count read from data is 101"):
        emulate_source(text, files, (3, 100, 32), np.int32)


def test_the_planner_counts_a_grouped_gemms_strips_not_its_items():
    """Placement deals strips (a group's column of items), each running its row blocks one after another: a plan
    whose strips leave most sites idle costs what it would take, so small groups get narrow, tall items."""
    p = spatialc.build(spatialc.grouped_gemm(8, 512, 256, 256, "bf16"), "sm_90")
    assert p.plan.items >= 64 and len(p.placement.items_of_site) >= 64  # 8 groups of 512 x 256: 16 strips before
    big = spatialc.build(spatialc.grouped_gemm(64, 4096, 4096, 4096, "bf16"), "sm_90")
    assert big.plan.items >= 132 * 4  # many strips already: large square items, as for one GEMM
    assert big.plan.item_tiles == (8, 8)


def test_an_fp16_grouped_bound_is_summed_in_float64_so_a_wrong_sum_past_fp16s_range_is_caught():
    """float16 operands are taken as they are; the bound's |A| @ |B| of each group is summed in float64, not in
    float16, where 200 · 200 · 64 = 2.56e6 overflowed to inf and any C passed."""
    import warnings

    p = spatialc.build(spatialc.grouped_gemm(2, 32, 32, 64, "fp16", out="float32"), "sm_86")
    sizes = next(t.name for t in p.tensors if t.role.value == "parameter")
    given = {"A": np.full((2, 32, 64), 200, np.float16), "B": np.full((2, 64, 32), 200, np.float16)}
    given[sizes] = np.array([32, 32], np.int32)
    tol = spatialc.tolerance(p)
    assert np.isfinite(tol.bound(given)).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = spatialc.evaluate(p, given)
    assert tol.check(c, given)[0]
    wrong = c.copy()
    wrong[0, 0, 0] *= 2
    assert not tol.check(wrong, given)[0]
