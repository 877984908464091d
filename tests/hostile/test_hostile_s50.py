"""A hostile review of saved files (review 50): the split tail, attention, W4A16 / block-scaled / MX programs, row
programs of several outputs, names, numeric edges, and the GPU check's prepared folder. What it found:

1. an attention program saved with tiles that are not square (32x16) was "verified": rule 8's attention
   declaration never looked at the tile, so the refusal came only when the interpreter ran its matmul — rule 1 now
   refuses a tile matmul of tiles that are not square, for every program (`verify/wellformed_compute.py`); and one
   whose plan's KV block (`block.ibw`) was not its schedule's was verified, rule 8 never reading it, while the
   sm_90a form printed its Q·Kᵀ wgmma at the plan's width (a kernel that does not build): rule 8 holds the K pages
   to it (`verify/attention_pages.py`);
2. a prepared folder's manifest.json whose kernels were not the entries `prepare` writes (a string, a list, an
   unknown or missing field, a field of another type) crashed `spatialc gpucheck --prepared DIR` (internal error,
   exit 3), a cubin named by a path (`../x`, `/abs`) was read from outside the folder, and text the dry run and the
   report quote (nvcc's version, a kernel's SASS census) reached the terminal with its escape sequences and line
   breaks: the manifest is checked field by field as it is read (`gpucheck/prepare.py`), one line and exit 2;
3. a document holding a key twice (`"tail": 0, "tail": 2`) was read as its last value, which another reader of the
   same file may not: `from_json` refuses it (`ir/serde.py`);
4. `lower --emit DIR` (and --json, --pictures) wrote through a link planted in the folder, and the gpucheck
   report, the cubin cache and the torch op cache wrote each file aside under a name one could guess, following a
   link planted there: one writer (`spatialc.files.write_whole`) makes the file aside new (O_EXCL) and renames it
   over the name, a link there replaced, not followed;
5. the torch op disk cache used any verified program at its key: a file put there holding a GEMM of the same sizes
   and name that computes something else (-(A @ B) for relu(A @ B)) was run silently. What the file's program
   declares is now held to what the family's program declares (`passes/declaration.py`), else it is built again;
6. a saved program or a manifest that is a FIFO hung `spatialc verify` and `gpucheck --prepared` (open() waits for
   a writer), and a manifest linked to /dev/zero was read until memory ran out: one reader
   (`spatialc.files.read_at_most`) opens without blocking and reads at most a bound.
"""

from __future__ import annotations

import copy
import json
import os
import re
import threading

import pytest

import spatialc
from spatialc.cli import main
from spatialc.errors import IllFormedError, SemanticError, SpatialError
from spatialc.files import write_whole
from spatialc.gpucheck.prepare import MANIFEST, Manifest
from spatialc.ir.serde import SerdeError


@pytest.fixture(scope="module")
def attention() -> dict:
    return json.loads(spatialc.to_json(spatialc.build(spatialc.attention(1, 2, 64, 64, 64, target="sm_90a"))))


def test_a_program_of_tiles_that_are_not_square_is_refused_before_it_runs(attention):
    doc = copy.deepcopy(attention)
    doc["program"]["tile"]["rows"] = 32  # the tensors' tile grids still hold their elements
    with pytest.raises(IllFormedError, match="a tile matmul multiplies square tiles, not 32x16"):
        spatialc.verify(spatialc.from_json(json.dumps(doc)))


@pytest.mark.parametrize("ibw", [1, 2])
def test_an_attention_plan_whose_kv_block_is_not_the_schedules_is_refused(attention, ibw):
    # The sm_90a form sizes its Q·Kᵀ wgmma by the plan's KV block; the schedule's K pages are 4 key tile rows.
    doc = copy.deepcopy(attention)
    doc["program"]["plans"][0]["block"]["ibw"] = ibw
    with pytest.raises(SemanticError, match=f"K's page holds 4 key tile rows, not the plan's KV block of {ibw}"):
        spatialc.verify(spatialc.from_json(json.dumps(doc)))


ENTRY = {"case": "fp16 64x64x64", "source_sha256": "0" * 64, "arch": "sm_90", "kernel_name": "k"}


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"kernels": "abc"}, "holds kernels that are not a list"),
        ({"kernels": [[1, 2]]}, "holds kernel 0: not an object"),
        ({"kernels": [{**ENTRY, "evil": 1}]}, "holds kernel 0: unknown fields ['evil']"),
        ({"kernels": [{"case": "x"}]}, "holds kernel 0: missing fields ['arch', 'kernel_name', 'source_sha256']"),
        (
            {"kernels": [{**ENTRY, "source_sha256": {"a": 1}}]},
            "holds kernel 0: its source_sha256 is not what prepare writes there",
        ),
        (
            {"kernels": [{**ENTRY, "ptxas": {"registers": "many"}}]},
            "holds kernel 0: its ptxas is not what prepare writes there",
        ),
        (
            {"kernels": [ENTRY, {**ENTRY, "cubin": "../k.cubin"}]},
            "holds kernel 1: cubin '../k.cubin' is not a file name",
        ),
        ({"kernels": [{**ENTRY, "cubin": "/tmp/k.cubin"}]}, "holds kernel 0: cubin '/tmp/k.cubin' is not a file name"),
        (
            {"kernels": [{**ENTRY, "sass": "ok\x1b]0;title\x07"}]},
            "holds kernel 0: its sass is not what prepare writes there",
        ),
        ({"nvcc": "12.4\x1b[2J\nforged line", "kernels": []}, "holds a nvcc that is not one line of text"),
    ],
)
def test_a_prepared_manifest_not_as_prepare_writes_it_is_one_line(tmp_path, capsys, fields, says):
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 1, **fields}))
    with pytest.raises(SpatialError, match=re.escape(f"{MANIFEST} {says}")):
        Manifest.load(tmp_path)
    assert main(["gpucheck", str(tmp_path / "out"), "--prepared", str(tmp_path), "--dry-run", "--sizes", "64"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_key_written_twice_is_refused():
    doc = spatialc.to_json(spatialc.build(spatialc.gemm(64, 64, 64, "fp16")))
    twice = doc.replace('"verified": true', '"verified": false, "verified": true', 1)
    with pytest.raises(SerdeError, match='program: the key "verified" is written twice'):
        spatialc.from_json(twice)


def test_lower_emit_replaces_a_link_planted_in_its_folder_and_writes_nothing_through_it(tmp_path, capsys):
    # `spatialc lower p.json --emit DIR` into a folder that came with the file: DIR/kernel.cu a link to a file of
    # the user's was written through (the same for --json, --pictures and the deadlock picture).
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    saved, emit = tmp_path / "p.json", tmp_path / "emit"
    saved.write_text(spatialc.to_json(spatialc.build(spatialc.gemm(32, 32, 32, "fp16"))))
    emit.mkdir()
    (emit / "kernel.cu").symlink_to(outside)
    assert main(["lower", str(saved), "--emit", str(emit)]) == 0
    assert outside.read_text() == "mine" and not (emit / "kernel.cu").is_symlink()


def test_a_link_planted_where_a_whole_write_goes_aside_is_not_followed(tmp_path):
    # The report's, the cubin cache's and the torch op cache's writes went aside to a name one could guess (the
    # process id); a link planted there in a shared folder had the write land wherever it pointed.
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / f".gpucheck.md.{os.getpid()}.tmp").symlink_to(outside)
    write_whole(folder / "gpucheck.md", "report")
    assert outside.read_text() == "mine" and (folder / "gpucheck.md").read_text() == "report"
    assert not (folder / "gpucheck.md").is_symlink()


def test_a_verified_program_of_another_meaning_in_the_torch_op_cache_is_built_again(tmp_path, monkeypatch):
    # The cache file a relu GEMM's op reads back, replaced by a verified GEMM of its sizes and name that computes
    # -(A @ B): it was used, every value of the op's result negated.
    torch = pytest.importorskip("torch")
    import spatialc.torch as sct

    monkeypatch.setenv("SPATIALC_CACHE", str(tmp_path))
    family = lambda m, n, k: spatialc.gemm(m, n, k, "bf16", epilogue=[spatialc.relu()])  # noqa: E731
    a, b = torch.ones(32, 48, dtype=torch.bfloat16), torch.ones(48, 64, dtype=torch.bfloat16)
    honest = sct.op(family, "hostile_s50_cache_first")(a, b)
    [kept] = (tmp_path / "torch").glob("*.json")
    negated = spatialc.build(spatialc.gemm(32, 64, 48, "bf16", epilogue=[spatialc.scalar("mul", -1.0)]))
    kept.write_text(spatialc.to_json(negated).replace(negated.name, "gemm_32x64x48_bf16_relu"))
    second = sct.op(family, "hostile_s50_cache_second")
    assert torch.equal(second(a, b), honest) and [e.source for e in second.compiled()] == ["built"]


READERS = {  # a command that reads a file another may have put, and the file's name in the folder
    "verify": (lambda folder: ["verify", str(folder / "p.json")], "p.json"),
    "gpucheck": (lambda folder: ["gpucheck", str(folder / "o"), "--prepared", str(folder), "--dry-run"], MANIFEST),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_fifo_no_one_writes_in_place_of_a_file_is_read_as_empty_not_waited_on(tmp_path, capsys, reader):
    # A saved program or a prepared folder's manifest that is a FIFO (an archive can hold one): open() waited for a
    # writer forever. (A link to /dev/zero, the other end, is read to the bound and refused.)
    argv, name = READERS[reader]
    os.mkfifo(tmp_path / name)
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(main(argv(tmp_path))), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert done == [2] and capsys.readouterr().err.count("\n") == 1
