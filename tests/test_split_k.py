"""Split-K: an item's K reduced on several sites whose partial sums meet in a workspace tensor (passes/split.py).

Through every layer: the planner's choice and its refusals, the rules that prove it (each item on `splits` sites,
every k-tile of K once across them, one writer of C per item, the handshake that orders the workspace), the
interpreter, the general form's kernel under emulation and nvcc, the launcher's workspace, the CLI.
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
from spatialc.ir import serde
from spatialc.ir.ids import Site
from spatialc.ir.nodes import Engine, TensorRole
from spatialc.ir.ops import (
    AddPartial,
    Compute,
    Loop,
    Pop,
    Push,
    ReadTiles,
    Reserve,
    SemInc,
    SemWait,
    Wait,
    WriteBarrier,
    WriteTiles,
)
from spatialc.passes.split import MAX_SPLITS, split_ranges, workspace_bytes
from spatialc.passes.verify import verify
from spatialc.runtime import launch as L
from spatialc.runtime.emulate import EmulationRace

from .nvcc_clean import nvcc_run
from .rewrite import edit, engine_orders
from .stand_in import CooperativeStandIn, product

RNG = np.random.default_rng(11)
emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")


def operands(prec: str, m: int, n: int, k: int, seed: int = 0) -> dict[str, np.ndarray]:
    """int8 over its range; fp16 / bf16 small integers, whose products and sums every order adds exactly."""
    rng = np.random.default_rng(seed)
    if prec == "int8":
        return {
            "A": rng.integers(-128, 128, (m, k)).astype(np.int8),
            "B": rng.integers(-128, 128, (k, n)).astype(np.int8),
        }
    return {"A": rng.integers(-4, 5, (m, k)).astype(np.float64), "B": rng.integers(-4, 5, (k, n)).astype(np.float64)}


def reference(ins: dict[str, np.ndarray]) -> np.ndarray:
    return ins["A"].astype(np.int64 if ins["A"].dtype == np.int8 else np.float64) @ ins["B"].astype(
        np.int64 if ins["B"].dtype == np.int8 else np.float64
    )


def split(m=64, n=64, k=1024, prec="int8", splits=3, tgt="sm_86", **kw):
    return spatialc.build(spatialc.gemm(m, n, k, prec, **kw), tgt, split_k=splits)


# ---- building and evaluating ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prec", "m", "n", "k", "splits", "tgt"),
    [
        ("int8", 64, 64, 1024, 2, "sm_86"),
        ("int8", 33, 17, 1000, 3, "sm_90"),
        ("int8", 48, 80, 2048, 5, "sm_80"),
        ("fp16", 48, 80, 700, 3, "sm_86"),
        ("bf16", 100, 30, 1500, 4, "sm_90"),
    ],
)
def test_a_split_program_verifies_and_evaluates_exactly(prec, m, n, k, splits, tgt):
    p = split(m, n, k, prec, splits, tgt)
    assert p.verified and p.placement.splits == splits and p.placement.kind == "split"
    plan = p.plan
    # Each item on `splits` sites, in a row: the owner first; each reduces its own run of K steps.
    for i in range(plan.items):
        sites = [int(s) for s, items in p.placement.items_of_site if items == (i,)]
        assert sites == list(range(i * splits, (i + 1) * splits))
    ranges = split_ranges(plan.k_steps, splits)
    assert sum(n for _, n in ranges) == plan.k_steps and all(n >= 1 for _, n in ranges)
    work = next(t for t in p.tensors if t.role == TensorRole.WORKSPACE)
    out = p.output_tensor()
    assert work.tiles == ((splits - 1) * out.tiles[0], out.tiles[1])
    assert workspace_bytes(p) == (splits - 1) * out.tiles[0] * out.tiles[1] * 256 * 4
    ins = operands(prec, m, n, k)
    got = spatialc.evaluate(p, ins)
    assert np.array_equal(got, reference(ins))


def test_an_epilogue_runs_once_on_the_owner_after_the_partials_are_added():
    p = split(40, 70, 900, "int8", 3, epilogue=[spatialc.bias(), spatialc.relu(), spatialc.requant(0.001, 3)])
    ins = operands("int8", 40, 70, 900) | {"bias": RNG.integers(-(2**15), 2**15, (1, 70)).astype(np.int32)}
    plain = spatialc.build(
        spatialc.gemm(40, 70, 900, "int8", epilogue=[spatialc.bias(), spatialc.relu(), spatialc.requant(0.001, 3)]),
        "sm_86",
        split_k=1,
    )
    assert plain.placement.splits == 1
    assert np.array_equal(spatialc.evaluate(p, ins), spatialc.evaluate(plain, ins))
    # Only the owner sites run the epilogue stages.
    epilogue_sites = {
        int(q.site)
        for q in p.schedule.programs
        if any(isinstance(op, Compute) and not isinstance(op.op, AddPartial) and op.outs for op in q.ops)
    }
    assert epilogue_sites == {s for s in range(len(p.placement.items_of_site)) if s % 3 == 0}


def test_the_result_does_not_depend_on_the_order_engines_run_in():
    """The interpreter picks engines round-robin; run it with the sites listed in other orders (which changes which
    engine moves first at every step) and the result is bit for bit the same — a float sum included."""
    p = split(48, 48, 1200, "fp16", 4, "sm_86")
    rng = np.random.default_rng(3)
    ins = {"A": rng.normal(size=(48, 1200)), "B": rng.normal(size=(1200, 48))}
    first = spatialc.evaluate(p, ins)
    for q in engine_orders(p):
        assert np.array_equal(spatialc.evaluate(verify(q), ins), first)


# ---- the planner -----------------------------------------------------------------------------------------------


def test_the_planner_splits_a_gemm_whose_items_leave_the_machine_idle():
    few = spatialc.build(spatialc.gemm(128, 128, 65536, "bf16"), "sm_90")
    assert few.placement.splits > 1
    sites = len(few.placement.items_of_site)
    assert few.plan.items * 2 <= spatialc.target("sm_90").units < sites * 2  # more than half the machine busy
    assert min(n for _, n in split_ranges(few.plan.k_steps, few.placement.splits)) >= 15
    for m, n, k, kw in [
        (4096, 4096, 4096, {}),
        (128, 128, 256, {}),
        (128, 128, 65536, {"form": "persistent"}),
        (128, 128, 65536, {"sites": 4}),
        (128, 128, 65536, {"placement": "contiguous"}),
    ]:
        p = spatialc.build(spatialc.gemm(m, n, k, "bf16"), "sm_90", **kw)
        assert p.placement.splits == 1, (m, n, k, kw)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"split_k": 0}, "a whole number ≥ 1"),
        ({"split_k": True}, "a whole number ≥ 1"),
        ({"split_k": 2.0}, "a whole number ≥ 1"),
        ({"split_k": MAX_SPLITS + 1}, f"at most {MAX_SPLITS} sites"),
        ({"split_k": 9, "block": (1, 1, 4)}, "has at most 8 K step(s), and each split needs one (use split_k ≤ 8,"),
        ({"split_k": 2, "form": "persistent"}, "form='general'"),
        ({"split_k": 2, "placement": "grouped"}, "takes no placement rule"),
        ({"split_k": 2, "sites": 3}, "sites, not 3"),
    ],
)
def test_a_split_the_program_cannot_take_is_one_clear_error(kw, words):
    """(K = 512 is 32 tiles: a plan of K steps of one tile gives 32 splits a step each, so split_k=9 fits unless a
    block forces 4-tile steps.)"""
    with pytest.raises(ProgramError) as info:
        spatialc.build(spatialc.gemm(64, 32, 512, "int8"), "sm_86", **kw)
    assert words in str(info.value)


def test_a_split_whose_sites_cannot_all_be_resident_is_refused_before_anything_runs():
    with pytest.raises(ProgramError, match="runs its .* sites at once .* keeps .* resident"):
        spatialc.build(spatialc.gemm(4096, 4096, 4096, "fp16"), "sm_90", split_k=8)


# ---- verify: what it must refuse -------------------------------------------------------------------------------


def owner_reader(p):
    return p.schedule.programs_of(Site(0))[0].ops


def refused(p, error=VerifyError, *words):
    with pytest.raises(error) as info:
        verify(p)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    return info.value


def only(p, site, engine, f):
    return edit(p.evolve(verified=False), engine, f, (Site(site),))


BASE = split(64, 64, 2048, "int8", 3)


def test_the_planted_handshake_faults_are_refused_by_name():
    drop = lambda kind: lambda ops: tuple(o for o in ops if not isinstance(o, kind))  # noqa: E731
    # a wait for fewer raises than come: the owner could read a partial not yet written
    refused(
        only(
            BASE, 0, Engine.READER, lambda ops: tuple(SemWait(o.sem, 1) if isinstance(o, SemWait) else o for o in ops)
        ),
        SemanticError,
        "at a count of only 1",
    )
    # no wait at all: the error names the read of the workspace it must come before (a user's line, in spatialc.lang)
    e = refused(only(BASE, 0, Engine.READER, drop(SemWait)), SemanticError, "without first waiting")
    assert e.op is not None and e.op.startswith("ReadTiles partials[") and e.op in str(e), str(e)
    # the raise before the write is visible
    refused(only(BASE, 1, Engine.WRITER, drop(WriteBarrier)), SemanticError, "before a WriteBarrier")
    # the raise before the write
    refused(
        only(BASE, 1, Engine.WRITER, lambda ops: (ops[-1], *ops[:-1])), SemanticError, "nothing after the write raises"
    )
    # a raise of the wrong site: the owner waits for a count never reached (a deadlock across sites)
    err = refused(
        only(
            BASE,
            1,
            Engine.WRITER,
            lambda ops: tuple(SemInc(o.sem, Site(5), 1) if isinstance(o, SemInc) else o for o in ops),
        ),
        VerifyError,
        "deadlock",
        "site 0 reader: SemWait",
    )
    assert "the count is 1, it needs 2" in str(err)
    # no raise at all
    refused(
        only(BASE, 2, Engine.WRITER, drop(SemInc)), VerifyError, "deadlock", "raised only by site 1 writer (finished)"
    )
    # a wait for more than ever comes
    refused(
        only(
            BASE, 0, Engine.READER, lambda ops: tuple(SemWait(o.sem, 3) if isinstance(o, SemWait) else o for o in ops)
        ),
        VerifyError,
        "deadlock",
    )


def test_partials_that_miss_or_repeat_part_of_K_are_refused():
    def read_slot(j):
        def f(ops):
            reads = [i for i, o in enumerate(ops) if isinstance(o, ReadTiles)]
            first = ops[reads[0]]
            return tuple(dataclasses.replace(o, at=first.at) if i == reads[j] else o for i, o in enumerate(ops))

        return f

    # the owner adds split 1's partial twice and split 2's never
    refused(only(BASE, 0, Engine.READER, read_slot(1)), SemanticError, "2 times")

    # a contributor reduces the owner's K steps instead of its own
    def own_range(ops):
        return tuple(
            dataclasses.replace(
                o,
                body=tuple(
                    dataclasses.replace(x, at=dataclasses.replace(x.at, base=0)) if isinstance(x, ReadTiles) else x
                    for x in o.body
                ),
            )
            if isinstance(o, Loop)
            else o
            for o in ops
        )

    refused(only(BASE, 2, Engine.READER, own_range), SemanticError, "k-tile 0 2 times")
    # a contributor that writes into another's slot: a partial overwritten before it is added
    refused(
        only(
            BASE,
            2,
            Engine.WRITER,
            lambda ops: tuple(
                dataclasses.replace(o, at=dataclasses.replace(o.at, base=0)) if isinstance(o, WriteTiles) else o
                for o in ops
            ),
        ),
        SemanticError,
        "overwritten",
    )
    # a page added that was never read from the workspace (the ring fed from the A tensor instead)
    refused(
        only(
            BASE,
            0,
            Engine.READER,
            lambda ops: tuple(
                dataclasses.replace(o, tensor=spatialc.ir.ids.TensorId(0))
                if isinstance(o, ReadTiles) and o.tensor == 3
                else o
                for o in ops
            ),
        ),
        VerifyError,
    )


def test_two_owners_of_one_item_are_refused():
    """Site 1, a contributor of item 0, instead reduces all of K and writes item 0's C itself (raising the owner as
    before, so nothing deadlocks): the item has two writers."""
    from spatialc.passes.schedule import engine_bodies
    from spatialc.passes.split import SEM_PARTIALS

    p = split(64, 64, 2048, "int8", 2)
    whole = engine_bodies(p)
    whole["writer"] = (*whole["writer"], WriteBarrier(), SemInc(SEM_PARTIALS, Site(0), 1))
    q = p.evolve(verified=False)
    for engine in (Engine.READER, Engine.COMPUTE, Engine.WRITER):  # the engines a built program runs
        q = edit(q, engine, lambda _ops, ops=whole[engine.value]: ops, (Site(1),))
    refused(q, SemanticError, "item 0 (y 0, x 0) is written to C by sites 0, 1")


def test_partials_read_and_added_in_a_loop_over_the_splits_are_followed():
    """The owner's reads and adds as loops over the other splits (one op each, the slot from the loop variable),
    not unrolled: the rule follows each iteration to its writer, and refuses the loop one iteration short."""
    from spatialc.ir.ids import LoopVar
    from spatialc.ir.ops import Const, TileAddr

    j = LoopVar(9)
    rows_cols = BASE.output_tensor().tiles[0] * BASE.output_tensor().tiles[1]

    def rolled(n):
        def reader(ops):
            first = next(i for i, o in enumerate(ops) if isinstance(o, Reserve) and i > 1)
            res, read, push = ops[first : first + 3]
            at = TileAddr(read.at.base, (*read.at.steps, (j, rows_cols)))
            return (*ops[:first], Loop(j, Const(n), (res, dataclasses.replace(read, at=at), push)))

        def compute(ops):
            adds = [i for i, o in enumerate(ops) if isinstance(o, Compute) and isinstance(o.op, AddPartial)]
            first = adds[0] - 1
            body = ops[first : first + 3]
            return (*ops[:first], Loop(j, Const(n), body), *ops[adds[-1] + 2 :])

        q = only(BASE, 0, Engine.READER, reader)
        return edit(q, Engine.COMPUTE, compute, (Site(0),))

    ins = operands("int8", 64, 64, 2048)
    assert np.array_equal(spatialc.evaluate(verify(rolled(2)), ins), reference(ins))
    refused(rolled(1), VerifyError)


def handshake_ops(p):
    """(site, engine, index) of every op of the split path: semaphores, the workspace's reads and writes, the
    partial rings' moves and the adds."""
    rings = {b.id for b in p.buffers if b.name.startswith("partial_")}
    out = []
    for q in p.schedule.programs:
        for i, op in enumerate(q.ops):
            if (
                isinstance(op, SemWait | SemInc | WriteBarrier)
                or (isinstance(op, ReadTiles | WriteTiles) and op.tensor == 3)
                or (isinstance(op, Reserve | Push | Wait | Pop) and op.buf in rings)
                or (isinstance(op, Compute) and isinstance(op.op, AddPartial))
            ):
                out.append((q.site, q.engine, i))
    return out


def test_every_handshake_op_deleted_or_changed_is_refused_or_still_right():
    """The mutation suite of the split path: each op deleted, each semaphore op's value or site changed. verify must
    refuse the result, or the result must still compute A @ B (checked by the interpreter)."""
    p = split(32, 32, 1024, "int8", 3, "sm_86")
    ins = operands("int8", 32, 32, 1024, 1)
    want = reference(ins)
    mutants = []
    for site, engine, i in handshake_ops(p):
        mutants.append(("delete", site, engine, lambda ops, i=i: ops[:i] + ops[i + 1 :]))
        op = p.schedule.programs_of(site)[[q.engine for q in p.schedule.programs_of(site)].index(engine)].ops[i]
        if isinstance(op, SemWait):
            for v in (op.value - 1, op.value + 1):
                mutants.append(
                    (f"wait {v}", site, engine, lambda ops, i=i, v=v: (*ops[:i], SemWait(ops[i].sem, v), *ops[i + 1 :]))
                )
        if isinstance(op, SemInc):
            for at in (int(op.at) + 1, int(site)):
                mutants.append(
                    (
                        f"inc at {at}",
                        site,
                        engine,
                        lambda ops, i=i, at=at: (*ops[:i], SemInc(ops[i].sem, Site(at), 1), *ops[i + 1 :]),
                    )
                )
            mutants.append(
                ("inc by 2", site, engine, lambda ops, i=i: (*ops[:i], SemInc(ops[i].sem, ops[i].at, 2), *ops[i + 1 :]))
            )
    assert len(mutants) >= 30
    accepted = 0
    for name, site, engine, f in mutants:
        q = only(p, int(site), engine, f)
        try:
            v = verify(q)
        except SpatialError:
            continue
        accepted += 1
        assert np.array_equal(spatialc.evaluate(v, ins), want), (name, site, engine)
    assert accepted < len(mutants) // 4  # nearly every edit of the handshake breaks it


# ---- saving, lowering, running -----------------------------------------------------------------------------------


def test_a_saved_split_program_loads_verified():
    doc = json.loads(spatialc.to_json(BASE))
    assert doc["version"] == serde.VERSION and doc["program"]["placement"]["splits"] == 3
    again = spatialc.from_json(json.dumps(doc))
    assert again == BASE and again.verified
    doc["program"]["placement"]["splits"] = 2  # the items are on 3 sites each
    with pytest.raises(VerifyError):
        verify(spatialc.from_json(json.dumps(doc)))


def test_split_programs_lower_to_the_general_form_with_their_workspace_in_the_ledger():
    art = spatialc.lower(BASE)
    assert art.budget.form == "general" and "split-K" in art.notes[0]
    assert art.budget.workspace_bytes == workspace_bytes(BASE) > 0
    assert art.launch.cooperative and art.launch.grid == len(BASE.placement.items_of_site)
    roles = [q.role for q in art.launch.params]
    assert roles.count("workspace") == 1
    # One printed branch per split, not per site: every contributor raises the owner `s` sites back.
    branches = set(re.findall(r"spatialc_site_class\[site\] == (\d+)", art.kernel_cu))
    assert branches == {"0", "1", "2"}
    assert "spatialc_grid_add(spatialc_sync + 0 + (site - 2), 1)" in art.kernel_cu
    assert "spatialc_add_acc(" in art.kernel_cu and "__threadfence();" in art.kernel_cu
    with pytest.raises(SpatialError, match="split-K"):
        spatialc.lower(BASE, form="persistent")


def split_device(art):
    """A GPU stand-in for a cooperative split kernel (132 SMs holding 4 blocks each): it writes C = A @ B."""
    return CooperativeStandIn(art, product, sms=132, per_sm=4)


def test_the_launcher_gives_the_kernel_its_workspace():
    art = spatialc.lower(BASE)
    dev = split_device(art)
    ins = operands("int8", 64, 64, 2048)
    c = L.run_with(dev, art, ins["A"], ins["B"])
    assert np.array_equal(c, reference(ins))
    seen = [(a.name, x.size, x.dtype) for a, x in zip(dev.args, dev.launches[0][4], strict=False)]
    ((_, _, _), (_, _, _), (_, _, _), (name, size, dtype)) = seen[:4]
    work = next(t for t in BASE.tensors if t.role == TensorRole.WORKSPACE)
    assert name == work.name and size == work.tiles[0] * work.tiles[1] * 256 and dtype == np.int32
    n = len(art.launch.params)  # then the work list and the sync words, set to their initial values
    assert len(dev.launches[0][4]) == n + 2 and np.array_equal(dev.launches[0][4][n + 1], art.launch.sync)
    with pytest.raises(spatialc.SpatialError, match="partials"):
        L.run_with(split_device(art), art, ins["A"], ins["B"], partials=np.zeros(3))


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize(
    ("prec", "m", "n", "k", "splits", "tgt", "kw"),
    [
        ("int8", 64, 64, 2048, 3, "sm_86", {}),
        ("fp16", 40, 24, 600, 2, "sm_86", {"epilogue": [spatialc.bias(), spatialc.activation("gelu_tanh")]}),
        ("bf16", 33, 17, 900, 4, "sm_89", {}),
    ],
)
def test_the_general_form_under_emulation_equals_the_interpreter(prec, m, n, k, splits, tgt, kw):
    p = split(m, n, k, prec, splits, tgt, **kw)
    ins = operands(prec, m, n, k, 2)
    if kw:
        ins["bias"] = np.random.default_rng(4).normal(size=(1, n)).astype(np.float32)
    want = spatialc.evaluate(p, ins)
    got = spatialc.emulate(spatialc.lower(p), ins)
    if kw:  # gelu in float32 against float64: the activation's stated tolerance
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert np.array_equal(got, want)


@emulation
@pytest.mark.emulation
def test_the_emulation_refuses_a_cooperative_grid_it_cannot_start_at_once():
    p = spatialc.build(spatialc.gemm(128, 128, 16384, "bf16"), "sm_90", split_k=16)
    with pytest.raises(spatialc.SpatialError, match="runs them all at once"):
        spatialc.emulate(spatialc.lower(p), operands("bf16", 128, 128, 16384))


NVCC = shutil.which("nvcc")


def compile_clean(tmp_path, programs, host) -> None:
    """Each program's program_cu compiles with nvcc -Werror for its target, ptxas reporting no spill: the one at index
    `host` in host mode (`-c`, its host code by gcc -Wall -Wextra -Werror), the others device-only (-cubin,
    tests/nvcc_clean.py)."""
    for i, p in enumerate(programs):
        src = tmp_path / f"{p.name}.cu"
        src.write_text(spatialc.lower(p).program_cu)
        out = nvcc_run(src, [p.target.removeprefix("sm_")], host=i == host)
        assert out.returncode == 0, out.stderr[-2000:]
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill", out.stderr)]
        assert spills and not any(spills), out.stderr[-2000:]


@pytest.mark.nvcc
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_split_kernels_compile_without_a_warning_or_a_spill(tmp_path):
    compile_clean(
        tmp_path,
        [
            split(64, 64, 2048, "int8", 3, "sm_80"),
            split(48, 80, 700, "fp16", 2, "sm_86", epilogue=[spatialc.bias(), spatialc.relu()]),
            split(128, 128, 8192, "bf16", 4, "sm_90"),
        ],
        host=1,  # the split-K host code, with a bias operand too
    )


# ---- the command line ----------------------------------------------------------------------------------------


def test_the_cli_splits_k_and_says_so(capsys):
    from spatialc.cli import main

    assert main(["gemm", "64", "64", "2048", "--split-k", "3", "--target", "sm_86"]) == 0
    out = capsys.readouterr().out
    assert "split-K   3 sites per item" in out and "workspace" in out
    assert main(["gemm", "64", "64", "2048", "--split-k", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "split_k must be a whole number" in err[0]


def test_the_listing_and_the_placement_picture_say_how_items_are_split():
    from spatialc.ir.printer import program_text
    from spatialc.viz import placement_svg

    text = program_text(BASE, sites=1)
    assert "each item on 3 sites (split-K)" in text and "semaphore sem0 partials" in text
    assert "add partial sum (partial_in) -> the accumulator" in text
    svg = placement_svg(BASE)
    assert "split-K: by the first of its 3 sites" in svg and "sites 0-2 (split-K; site 0 adds" in svg


def test_a_split_asked_for_gets_a_plan_with_a_k_step_for_each_split():
    """The planner's best plan may step through K in few large steps; a split asks for a K step per site, so the
    plan made for it steps more finely where it must — and where no plan can, says how far it can go."""
    p = spatialc.build(spatialc.gemm(16, 16, 256, "bf16"), "sm_90", split_k=7)
    assert p.placement.splits == 7 and p.plan.k_steps >= 7
    with pytest.raises(ProgramError, match=r"at most 4 K step\(s\), and each split needs one \(use split_k ≤ 4, "):
        spatialc.build(spatialc.gemm(16, 16, 64, "bf16"), "sm_90", split_k=7)


def test_the_planners_own_split_never_refuses_a_build():
    """The split is chosen on one plan and the program planned again for it: where the new plan's items would not
    all be resident split so, the planner splits less (or not at all) rather than refusing a build nobody asked to
    split. Every split it makes keeps all its sites resident."""
    from spatialc.passes.footprint import sites_per_unit

    split_seen = 0
    for m, n, k, prec, tgt in [(700, 1024, 40000, "int8", "sm_86"), (256, 300, 5000, "bf16", "sm_80"),
                               (100, 3000, 20000, "bf16", "sm_90"), (16, 16, 40000, "int8", "sm_90")]:  # fmt: skip
        p = spatialc.build(spatialc.gemm(m, n, k, prec), tgt)  # never raises
        if p.placement.splits > 1:
            split_seen += 1
            per_unit = sites_per_unit(spatialc.target(tgt), p.plan, p.precision, "general", 1)
            assert len(p.placement.items_of_site) <= spatialc.target(tgt).units * per_unit
    assert split_seen >= 2


# ---- a missing release, in the mode where plain stores become visible late ------------------------------------


def _released(text: str, fence: bool, release: bool) -> str:
    """`text` with each contributor's fence (WriteBarrier) and release add (SemInc) kept or taken away."""
    if not fence:
        text = text.replace("__threadfence();  // op:WriteBarrier", "// (no fence)")
    if not release:
        text = re.sub(
            r"spatialc_grid_add\((spatialc_sync \+ 0 \+ \(site - \d\), 1)\)", r"spatialc_grid_add_relaxed(\1)", text
        )
    return text


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize(("fence", "release"), [(False, True), (False, False)])
def test_a_missing_release_before_the_raise_is_caught_where_plain_stores_land_late(fence, release):
    """The workspace's stores are plain; in late mode the emulation keeps them invisible at device scope until a
    thread holding them fences or releases — its own, or one that crossed the engine's barrier with it (PTX's
    cumulativity). The contributor fences and raises with a release add: the release after the engine's barrier is
    enough by itself; with neither, nothing orders the partial sums before the owner's reads, which both modes
    report as a race between blocks (runtime/emu/emu_global.h; early mode, where the stores are visible at once,
    used to hide it)."""
    p = split(64, 64, 2048, "int8", 3, "sm_86")
    ins = operands("int8", 64, 64, 2048, 5)
    art = spatialc.lower(p)
    text = _released(art.program_cu, fence, release)
    assert text != art.program_cu
    planted = dataclasses.replace(art, program_cu=text)
    want = spatialc.evaluate(p, ins)
    for mode in ("early", "late"):
        if fence or release:
            assert np.array_equal(spatialc.emulate(planted, ins, mode=mode), want)
        else:
            with pytest.raises(EmulationRace, match="nothing orders that write first"):
                spatialc.emulate(planted, ins, mode=mode)
