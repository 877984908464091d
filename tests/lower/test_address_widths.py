"""Address arithmetic at the 2^31 boundary, in every form, and ring counters at 2^32.

Rule 1 keeps a tensor's tile count within a C int, so a tile index fits an `int`; its element or byte offset does
not (a 2^31 + 16 long K is 2^27 + 1 tiles, 2^31 + 16 elements). The persistent and general forms widen the offset
to 64 bits before scaling it; the sm_90a form's TMA coordinates are signed 32-bit in PTX, so it refuses such a
tensor and `auto` falls back with a note. No test here runs a 4 GiB operand: they read the printed arithmetic.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

import spatialc
from spatialc.lower.errors import Unsupported

LONG_K = 2**31 + 16


def narrow_offsets(text: str) -> list[str]:
    """Lines that scale a tile index by a tile's elements or bytes in 32-bit arithmetic: `tile * …` where `tile`
    is an int and not cast to long long first."""
    wide, bad = False, []
    for line in text.splitlines():
        declared = re.search(r"\b(int|long long) tile = ", line)
        if declared:
            wide = declared.group(1) == "long long"
        for m in re.finditer(r"(\(long long\))?\btile \* ", line):
            if m.group(1) is None and not wide:
                bad.append(line.strip())
    return bad


@pytest.fixture(scope="module")
def long_k():
    return spatialc.build(spatialc.gemm(1, 1, LONG_K, "bf16"), "sm_90", split_k=1)


@pytest.mark.parametrize("form", ["persistent", "general"])
def test_the_persistent_and_general_forms_scale_tile_indices_in_64_bits(long_k, form):
    a = spatialc.lower(long_k, form=form)
    assert a.budget.form == form
    k_tiles = long_k.plans[0].k_tiles  # A's row of tiles, K long (padded to whole K steps of 8 tiles: 134217736)
    assert str(k_tiles) in a.kernel_cu and k_tiles * 256 > 2**31  # its last tile's offset passes 2^31 elements
    assert narrow_offsets(a.kernel_cu) == []


def test_the_check_finds_a_narrow_offset():
    """The reader of the printed text is trusted only once it fails on a planted 32-bit offset."""
    planted = "const int tile = base + tl;\nSPATIALC_OUT_ST(&t2[tile * 256 + el], v);"
    assert narrow_offsets(planted) == ["SPATIALC_OUT_ST(&t2[tile * 256 + el], v);"]
    assert narrow_offsets(planted.replace("const int", "const long long")) == []


def test_the_sm90a_form_refuses_a_tensor_past_its_32_bit_coordinates_and_auto_falls_back():
    p = spatialc.build(spatialc.gemm(1, 1, LONG_K, "bf16"), "sm_90a", split_k=1)
    padded = p.plans[0].k_tiles * 16  # K in whole K steps of the plan (2147483776: steps of 8 tiles)
    refused = rf"tensor A of 32 x {padded} elements .*signed 32-bit int, at most 2147483647"
    with pytest.raises(Unsupported, match=refused):
        spatialc.lower(p, form="sm90a")
    a = spatialc.lower(p)
    assert a.budget.form != "sm90a" and any("a TMA coordinate is a signed 32-bit int" in n for n in a.notes)
    # At the boundary's other side the form takes it: 2^31 - 64 elements of K, padded to whole K steps.
    q = spatialc.build(spatialc.gemm(1, 1, 2**31 - 64, "bf16"), "sm_90a", split_k=1)
    assert spatialc.lower(q, form="sm90a").budget.form == "sm90a"


@pytest.mark.parametrize("depth", [3, 4])
def test_the_general_form_refuses_a_ring_whose_32_bit_counters_would_wrap_onto_the_wrong_slot(depth):
    """A ring's counters are `unsigned`: past 2^32 pages `count % DEPTH` jumps a slot unless DEPTH is a power of
    two. Four items a site, each 2^31 - 1 K steps: about 2^33 pages through A's ring."""
    from spatialc.ir.ids import LV_K
    from spatialc.ir.ops import Const, Loop
    from spatialc.lower.cuda.general import checks

    from ..rewrite import map_ops

    p = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 4), sites=1, depth=depth, split_k=1)
    assert p.plan.items == 16

    def long_k(op):
        if isinstance(op, Loop) and op.var == LV_K:
            return (dataclasses.replace(op, count=Const(2**31 - 1)),)
        return None

    progs = tuple(dataclasses.replace(q, ops=map_ops(q.ops, long_k)) for q in p.schedule.programs)
    long = p.evolve(schedule=dataclasses.replace(p.schedule, programs=progs))
    assert checks.reserved_pages(progs[0].ops)[progs[0].ops[0].body[0].body[0].buf] == 16 * (2**31 - 1)
    if depth == 3:
        with pytest.raises(Unsupported, match=r"ring A_ring of 3 pages passing up to 34359738352 pages on site 0"):
            checks.check_counter_wrap(long)
        with pytest.raises(Unsupported, match="its 32-bit counters wrap at 2"):
            checks.refuse(long.evolve(verified=True))  # the form's refusal makes the check (the mark: a stand-in)
    else:
        checks.check_counter_wrap(long)  # a power-of-two depth wraps cleanly
    checks.refuse(p)  # the program as built passes few pages
