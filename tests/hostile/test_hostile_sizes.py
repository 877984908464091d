"""A hostile review of saved programs' sizes (review 49): the lists the reader left unbounded, and what a huge file
cost before anything refused it.

1. 100,000 tensors: `spatialc verify` 33 s and 720 MB, then "verified"; 100,000 buffers: over a minute; 100,000
   stages or plans: 5-7 s of decoding before verify refused them; 100,000 multicast groups: read and verified; a
   compute op or stage naming 1,000,000 rings: 55 s and 2.2 GB. Every list a program holds now has a bound in
   `ir/serde.py` (`_LIST_LIMITS`, `_ENTRY_LIMITS`), checked before one entry of it is decoded, and verify holds a
   program built in Python to the same bounds before it type-checks each entry;
2. 10,000,000 items on one site (89 MB): 21 s and 1.1 GB before the coverage rule refused them: the reader now
   counts the items listed against what the plan could place (each item on at most 32 sites, split-K's bound)
   before decoding one, and reads a list of plain ids as a copy, not value by value;
3. 32 engine programs of 16,384 ops (62 MB): a minute to refuse: the schedule's ops, loop bodies included, are
   counted before decoding, at most MAX_SCHEDULE_OPS;
4. 262,144 programs (150 MB): 20 s and 1.2 GB in the JSON parse alone: a document of more than MAX_OBJECTS objects
   is refused before it is parsed;
5. (session 50) 60,000,000 empty lists in a field the reader ignores (180 MB, under the CLI's 512 MiB): 36 s and
   4.6 GB to parse, then "verified": lists and values are counted before the parse too (MAX_LISTS, MAX_VALUES).
"""

from __future__ import annotations

import dataclasses
import json
import time
import typing

import pytest

import spatialc
from spatialc.cli import main
from spatialc.errors import CoverageError, IllFormedError
from spatialc.ir import nodes, ops, serde
from spatialc.ir.ids import GroupId, ItemId
from spatialc.ir.serde import (
    MAX_ITEM_SITES,
    MAX_LISTS,
    MAX_OBJECTS,
    MAX_OPERANDS,
    MAX_OPS,
    MAX_PLANS,
    MAX_SCHEDULE_OPS,
    MAX_SITES,
    MAX_TABLE,
    MAX_VALUES,
    SerdeError,
)
from spatialc.passes.split import MAX_SPLITS


@pytest.fixture(scope="module")
def gemm() -> str:
    return spatialc.to_json(spatialc.build(spatialc.gemm(256, 256, 256)))


def refused(text: str, match: str) -> str:
    """The reader's message for `text`, which must come without the minutes the unbounded reader took (this process's
    CPU, not the loaded machine's wall clock; a guard against that, ten times what a refusal costs here — not a speed
    goal, which bench/ would hold)."""
    t0 = time.process_time()
    with pytest.raises(SerdeError, match=match or None) as e:
        spatialc.from_json(text)
    assert time.process_time() - t0 < 15.0
    return str(e.value)


def first_compute(p: dict) -> dict:
    prog = next(q for q in p["schedule"]["programs"] if q["engine"] == "compute")
    return next(op for loop in prog["ops"] for op in loop.get("body", []) if op["type"] == "Compute")


TABLES = {
    "tensors": (MAX_TABLE, lambda p: [dict(p["tensors"][0], id=i, name=f"t{i}") for i in range(MAX_TABLE + 1)]),
    "stages": (MAX_TABLE, lambda p: [dict(p["stages"][0], id=i, name=f"s{i}") for i in range(MAX_TABLE + 1)]),
    "buffers": (MAX_TABLE, lambda p: [dict(p["buffers"][0], id=i, name=f"b{i}") for i in range(MAX_TABLE + 1)]),
    "plans": (MAX_PLANS, lambda p: p["plans"] * (MAX_PLANS + 1)),
}


@pytest.mark.parametrize("field", sorted(TABLES))
def test_a_table_longer_than_its_bound_is_refused_before_decoding(gemm, field):
    doc = json.loads(gemm)
    most, entries = TABLES[field]
    doc["program"][field] = entries(doc["program"])
    assert f"program.{field}: {most + 1} {field}; a SpatialProgram has at most {most}" in refused(json.dumps(doc), "")


@pytest.mark.parametrize("where", ["stage", "compute", "groups", "group"])
def test_a_list_inside_a_program_longer_than_its_bound_is_refused(gemm, where):
    doc = json.loads(gemm)
    p = doc["program"]
    if where == "stage":
        p["stages"][2]["ins"] = [0] * (MAX_OPERANDS + 1)
        want = f"program.stages[2].ins: {MAX_OPERANDS + 1} rings; a Stage has at most {MAX_OPERANDS}"
    elif where == "compute":
        first_compute(p)["outs"] = [3] * (MAX_OPERANDS + 1)
        want = f".outs: {MAX_OPERANDS + 1} rings; a Compute has at most {MAX_OPERANDS}"
    elif where == "groups":
        p["placement"]["groups"] = [{"type": "Group", "id": i, "sites": [0]} for i in range(MAX_SITES + 1)]
        want = f"program.placement.groups: {MAX_SITES + 1} groups; a Placement has at most {MAX_SITES}"
    else:
        p["placement"]["groups"] = [{"type": "Group", "id": 0, "sites": [0] * (MAX_SITES + 1)}]
        want = f"program.placement.groups[0].sites: {MAX_SITES + 1} sites; a Group has at most {MAX_SITES}"
    assert want in refused(json.dumps(doc), "")


def variadic_fields() -> list[tuple[type, str, typing.Any]]:
    """(class, field, entry annotation) of every list of any length in the IR's dataclasses."""
    out = []
    for module in (ops, nodes):
        for cls in vars(module).values():
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__):
                continue
            for f in dataclasses.fields(cls):
                args = typing.get_args(serde._hints(cls)[f.name])
                if len(args) == 2 and args[1] is Ellipsis:
                    out.append((cls, f.name, args[0]))
    return out


def test_every_list_of_the_ir_has_a_bound():
    """A field added later without a bound fails here, not in a review."""
    fields = variadic_fields()
    assert len(fields) > 15  # (the walk finds them)
    assert [(c.__name__, f) for c, f, _ in fields if (c, f) not in serde._LIST_LIMITS] == []
    nested = [a for _, _, entry in fields for a in typing.get_args(entry) if typing.get_origin(a) is tuple]
    assert [a for a in nested if typing.get_args(a)[0] not in serde._ENTRY_LIMITS] == []  # a site's items


def test_more_items_than_the_plan_places_are_refused_before_decoding(gemm, tmp_path, capsys):
    doc = json.loads(gemm)
    listed = doc["program"]["placement"]["items_of_site"]
    listed[0][1] = list(range(2_000_000))  # the plan places 32, each on at most 32 sites
    want = "program: placement.items_of_site: 2000031 items listed in all; its plan's 32 items, each on at most 32"
    assert want in refused(json.dumps(doc), "")
    path = tmp_path / "items.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["verify", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and want in err, err[:300]


def test_a_split_program_reads_and_a_few_items_too_many_reach_the_coverage_rule():
    """The count allows each item on as many sites as split-K ever puts it (verify's bound): below that, the
    coverage rule names the item."""
    assert MAX_ITEM_SITES == MAX_SPLITS
    p = spatialc.build(spatialc.gemm(128, 128, 8192), split_k=4)
    assert p.placement.splits == 4 and sum(len(i) for _, i in p.placement.items_of_site) == 4 * p.plan.items
    assert spatialc.from_json(spatialc.to_json(p)).placement == p.placement
    doc = json.loads(spatialc.to_json(p))
    doc["program"]["placement"]["items_of_site"][0][1] += [0] * (MAX_SPLITS * p.plan.items - 4 * p.plan.items)
    with pytest.raises(CoverageError, match=r"item 0 \(y 0, x 0\) of the .* grid is on sites 0, 0"):
        spatialc.verify(spatialc.from_json(json.dumps(doc)))
    doc["program"]["placement"]["items_of_site"][0][1].append(0)
    refused(json.dumps(doc), f"{MAX_SPLITS * p.plan.items + 1} items listed in all; its plan's {p.plan.items} items")


def test_a_sites_list_of_items_has_a_bound_and_plain_ids_read_as_before(gemm, monkeypatch):
    doc = json.loads(gemm)
    listed = doc["program"]["placement"]["items_of_site"]
    monkeypatch.setitem(serde._ENTRY_LIMITS, ItemId, (3, "items", "a site lists"))  # 2^24 ids take 150 MB
    listed[0][1] = [0, 1, 2, 3]
    doc["program"]["plans"] = doc["program"]["plans"] * 2  # (no one plan: the count of all items is not the check)
    refused(json.dumps(doc), r"items_of_site\[0\]\[1\]: 4 items; a site lists at most 3")
    monkeypatch.undo()
    for bad, what in (
        (True, "an integer of at most 64 bits, found true"),
        (2**70, "an integer of at most 64 bits, found an integer of 71 bits"),
    ):
        listed[0][1] = [0, bad]
        refused(json.dumps(doc), rf"program.placement.items_of_site\[0\]\[1\]\[1\]: expected {what}")


def test_more_ops_than_a_schedule_holds_are_refused_before_decoding(gemm):
    doc = json.loads(gemm)
    progs = doc["program"]["schedule"]["programs"]
    pop = {"type": "Pop", "buf": 0, "pages": 1}
    for prog in progs[: MAX_SCHEDULE_OPS // MAX_OPS + 1]:
        prog["ops"] = [pop] * MAX_OPS
    want = f"more than {MAX_SCHEDULE_OPS} ops in its engine programs, loop bodies included"
    assert want in refused(json.dumps(doc), "")
    for prog in progs[: MAX_SCHEDULE_OPS // MAX_OPS + 1]:  # inside a loop's body too
        prog["ops"] = [{"type": "Loop", "var": 9, "count": {"type": "Const", "n": 1}, "body": [pop] * MAX_OPS}]
    assert want in refused(json.dumps(doc), "")


def test_a_document_of_more_objects_than_any_program_is_refused_before_it_is_parsed(gemm):
    head, tail = gemm.split('"ops": [', 1)
    text = head + '"ops": [' + '{"type": "Flush"}, ' * MAX_OBJECTS + tail
    refused(text, rf"a document of {MAX_OBJECTS + gemm.count('{')} objects; a spatialc program has at most")
    refused(text.encode(), "objects; a spatialc program has at most")


@pytest.mark.parametrize(("filler", "what", "most"), [("[], ", "lists", MAX_LISTS), ("0, ", "values", MAX_VALUES)])
def test_a_document_of_more_lists_or_values_than_any_program_is_refused_before_it_is_parsed(gemm, filler, what, most):
    head, tail = gemm.split('"ops": [', 1)
    refused(head + '"ops": [' + filler * most + tail, f"{what}; a spatialc program has at most {most}$")


def test_verify_holds_a_program_built_in_python_to_the_same_bounds_before_checking_each_entry(gemm):
    p = spatialc.from_json(gemm)
    t = p.tensors[0]
    many = tuple(dataclasses.replace(t, id=type(t.id)(i), name=f"t{i}") for i in range(3, 100_003))
    t0 = time.process_time()
    with pytest.raises(IllFormedError, match=f"a program of 100003 tensors; at most {MAX_TABLE}"):
        spatialc.verify(p.evolve(tensors=p.tensors + many))
    assert time.process_time() - t0 < 10.0  # (the rules took half a minute over them: a guard, not a speed goal)
    groups = tuple(nodes.Group(id=GroupId(i), sites=(p.placement.sites[0],)) for i in range(70_000))
    with pytest.raises(IllFormedError, match=f"70000 multicast groups; at most {MAX_SITES}"):
        spatialc.verify(p.evolve(placement=dataclasses.replace(p.placement, groups=groups)))


def test_a_sites_plain_item_ids_are_read_whole_and_a_bad_one_still_named(gemm):
    """A site's list of plain integer ids is read as one copy (`serde._plain_ids`; `show` took 35 s over 10,000,000
    items decoded one by one): the same ids, as ItemIds — and a list with any other entry is still decoded entry by
    entry, the bad one named by its place. (Its speed is not timed here: a unit test's clock is the CI machine's.)"""
    doc = json.loads(gemm)
    doc["program"]["verified"] = False  # (read only: no verify behind it)
    doc["program"]["plans"][0]["grid"] = [512, 512]
    doc["program"]["placement"]["items_of_site"][0][1] = list(range(200_000))
    p = spatialc.from_json(json.dumps(doc))
    items = p.placement.items_of_site[0][1]
    assert len(items) == 200_000 and type(items[7]) is ItemId and items[7] == 7 and items[-1] == 199_999
    for bad, said in ((True, "an integer"), (2**70, "an integer of at most"), ("7", "an integer")):
        doc["program"]["placement"]["items_of_site"][0][1] = [0, 1, bad, 3]
        with pytest.raises(spatialc.SerdeError, match=r"items_of_site\[0\]\[1\]\[2\].*" + said):
            spatialc.from_json(json.dumps(doc))
