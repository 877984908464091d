"""Every emitted kernel, in both forms (the persistent kernel and the general form it carries), compiles with nvcc
for sm_80, sm_86 and sm_90 without a warning, spills nothing, and uses the static shared memory its budget predicted
(`ptxas -v`).

nvcc is slow, so the texts of one target are compiled together: each artifact's program_cu and bench_cu inside a
namespace of its own (its extern "C" kernel renamed for it), its macros undefined after it, in one translation unit
per target (three nvcc calls, run in parallel). The two texts differ only in their host code, after the kernel: the
kernel they share is compiled once, each text's own host code in a namespace of its own beside it. One program_cu
is also compiled alone for all three architectures, as the self-contained text it is.

Which compile covers the host code: sm_90's unit and the lone program_cu are built into executables (host code by
gcc -Wall -Wextra -Werror, then linked); sm_80's and sm_86's units are compiled device-only (-cubin: the device
front end still parses their host code, tests/nvcc_clean.py), as their host code is sm_90's printer paths again —
sm_80's host lines are a subset of sm_90's (numbers aside), sm_86's differ only in its fp16 attention's element type.
"""

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

import spatialc
from spatialc.frontend import bias, relu, requant, scalar
from spatialc.lower.cuda.common.cwriter import INCLUDES
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.cuda.general.kernel import KERNEL_NAME as GENERAL_KERNEL
from spatialc.lower.cuda.persistent.printer import KERNEL_NAME

from .. import nvcc_clean
from ..nvcc_clean import FLAGS
from .test_general_attention import lowered as attention_lowered
from .test_general_attention import program as attention_program
from .test_general_sync import handshake, with_barrier
from .test_general_trip import trip_program

NVCC = shutil.which("nvcc")
pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")]

TARGETS = ("sm_80", "sm_86", "sm_90")
PRECISIONS = ("int8", "fp16", "bf16")
SHAPES = {
    "one_element": (1, 1, 1, {}),
    "odd": (33, 17, 49, {}),
    "cube_on_8_sites": (256, 256, 256, {"sites": 8}),
    "more_sites_than_items": (64, 64, 32, {"sites": 40}),
    "fused_epilogue": (64, 64, 64, {"block": (2, 4, 2)}),
    "sub_blocks": (128, 128, 64, {"block": (2, 4, 1), "sub_blocks": (2, 2)}),
    "dynamic_rings": (128, 128, 128, {"block": (4, 4, 4), "depth": 4}),
    "depth_1": (100, 70, 50, {"depth": 1}),
}
# sm_80 compiles every shape; sm_86 (four warps, plans of their own) and sm_90 five of them (a third less nvcc time):
# the one-element, eight-site and idle-site kernels print the same code paths at other constants, checked on sm_80.
SHAPES_ELSEWHERE = ("odd", "fused_epilogue", "sub_blocks", "dynamic_rings", "depth_1")
OUTPUTS = (("fp16", "fp16"), ("bf16", "bf16"), ("int8", "int64"))
ATTENTION = {  # target → (batch, heads, seq_q, seq_kv, head_dim), options
    "sm_80": ((1, 2, 72, 72, 128), {"block": (2, 4), "causal": True}),
    "sm_86": ((2, 4, 40, 72, 64), {"block": (2, 2), "kv_heads": 2, "precision": "fp16", "out": "fp16"}),
    "sm_90": ((1, 2, 128, 128, 128), {"block": (4, 4)}),
}


def gencode(tgt):
    """nvcc_clean's -gencode flags for a target named as spatialc names it ("sm_80")."""
    return nvcc_clean.gencode([tgt.removeprefix("sm_")])


def artifacts(tgt):
    """(case name, artifact) for every shape and precision lowered for `tgt`, each in both forms."""
    out = []
    programs = [
        (f"{name}/{prec}", spatialc.build(spatialc.gemm(m, n, k, prec), tgt, **kw))
        for name, (m, n, k, kw) in SHAPES.items()
        if tgt == "sm_80" or name in SHAPES_ELSEWHERE
        for prec in PRECISIONS
    ]
    # C stored as torch stores it, or as asked
    programs += [
        (f"odd/{prec}-out-{c}", spatialc.build(spatialc.gemm(33, 17, 49, prec, out=c), tgt)) for prec, c in OUTPUTS
    ]
    # Epilogues on one-tile blocks, which only the general form prints (its stages page to page).
    for prec, chain in (("int8", [bias(), relu(), requant(0.01, 2)]), ("bf16", [bias(), scalar("mul", 0.5), relu()])):
        gemm = spatialc.gemm(40, 48, 64, prec, epilogue=chain)
        programs.append((f"one_tile_epilogue/{prec}", spatialc.build(gemm, tgt, block=(1, 1, 1), sites=3)))
    # Sites that hand over to each other — a group barrier after each item, over every site or two; a semaphore
    # handshake — in cooperative launches (the general form only).
    base = spatialc.build(spatialc.gemm(64, 64, 64, "fp16"), tgt, block=(1, 1, 1), sites=4)
    programs.append(("group_barrier/fp16", spatialc.verify(with_barrier(base))))
    programs.append(("partial_barrier/fp16", spatialc.verify(with_barrier(base, members=2, crossing=(0, 1)))))
    programs.append(("handshake/fp16", spatialc.verify(handshake(base, waiter=3))))
    # Multicast groups, printed as thread-block clusters with distributed shared memory: sm_90 only.
    if tgt == "sm_90":
        for prec, group in (("fp16", (2, 2)), ("int8", (1, 2)), ("bf16", (2, 1))):
            gemm = spatialc.gemm(256, 256, 128, prec)
            name = f"multicast_{group[0]}x{group[1]}/{prec}"
            programs.append((name, spatialc.build(gemm, tgt, multicast=group, sites=8)))
    # A loop count read from data (verify does not accept it yet: the general backend prints it directly).
    extra = [("trip_loop/int8", general.lower(trip_program(), spatialc.target(tgt)))]
    # Attention, which only the general form prints: its compute warps hold S's and O's fragments and the rows' maxima
    # and sums at once — at (bh, bw, dt) = (4, 4, 8) on sm_90, a block that fits the shared memory of the others.
    shape, options = ATTENTION[tgt]
    extra.append((f"attention/{tgt}", attention_lowered(attention_program(*shape, tgt=tgt, **options))))
    for name, p in programs:
        art = spatialc.lower(p)
        if art.budget.form == "general":
            out.append((f"{name}/general", art))
            continue
        assert art.general is not None, art.notes
        out += [(name, art), (f"{name}/general", art.general)]
    return out + extra


def in_namespace(text, i, kind):
    """`text` inside namespace spatialc_case_<i>_<kind>, its macros undefined after it. The kernel is extern "C", a
    name no namespace encloses, so it is renamed spatialc_case_<i>_<kind>_kernel (ptxas then names the case)."""
    text = re.sub(rf"\b({KERNEL_NAME}|{GENERAL_KERNEL})\b", f"spatialc_case_{i}_{kind}_kernel", text)
    undef = "".join(f"#undef {d}\n" for d in sorted(set(re.findall(r"^#define (\w+)", text, re.M))))
    return f"namespace spatialc_case_{i}_{kind} {{\n{text}}}\n{undef}"


def split_host(program_cu, bench_cu):
    """(the lines both texts begin with, program_cu's rest, bench_cu's rest) where the rests are host code (no
    kernel, no macro), else None."""
    p, b = program_cu.split("\n"), bench_cu.split("\n")
    n = next((i for i, (x, y) in enumerate(zip(p, b, strict=False)) if x != y), min(len(p), len(b)))
    rests = "\n".join(p[n:]), "\n".join(b[n:])
    if any("__global__" in rest or "#define" in rest for rest in rests):
        return None
    return "\n".join(p[:n]) + "\n", *rests


def case_texts(i, art):
    """An artifact's program_cu and bench_cu, in namespaces: their shared kernel once (kind s) with each one's host
    code in a namespace of its own (p, b) inside, or, where their kernels differ, each whole (kinds p and b)."""
    split = split_host(art.program_cu, art.bench_cu)
    if split is None:
        return [in_namespace(art.program_cu, i, "p"), in_namespace(art.bench_cu, i, "b")]
    head, program, bench = split
    return [in_namespace(f"{head}namespace p {{\n{program}}}\nnamespace b {{\n{bench}}}\n", i, "s")]


def translation_unit(arts):
    """Every artifact's program_cu and bench_cu in one file: the headers first, so each text's includes are no-ops.
    Also the number of kernels in it."""
    parts = [f"#include <{h}>\n" for h in INCLUDES]
    kernels = 0
    for i, (_, art) in enumerate(arts):
        texts = case_texts(i, art)
        parts += texts
        kernels += len(texts)
    parts.append("int main() { return 0; }\n")
    return "".join(parts), kernels


def ptxas_entries(log):
    """(case index, p/b/s, arch, spill bytes, static smem bytes) for each kernel ptxas compiled."""
    entries = []
    for chunk in re.split(r"(?=ptxas info\s+: Compiling entry function)", log)[1:]:
        head = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", chunk)
        case = re.search(r"spatialc_case_(\d+)_([pbs])", head.group(1))
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", chunk)
        smem = re.search(r"(\d+) bytes smem", chunk)
        entries.append(
            (
                int(case.group(1)) if case else None,
                case.group(2) if case else None,
                head.group(2),
                int(spill.group(1)) + int(spill.group(2)),
                int(smem.group(1)) if smem else 0,
            )
        )
    return entries


HOST_CODE = ("sm_90", "alone")  # the units whose host code is compiled (and linked); the others device-only


def nvcc(src, out, archs, host):
    mode = [] if host else ["-cubin"]
    cmd = [NVCC, *mode, "-o", str(out), str(src), *[g for a in archs for g in gencode(a)], *FLAGS]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """target → (artifacts, kernels, nvcc result); "alone" → the same for one program_cu compiled by itself."""
    d = tmp_path_factory.mktemp("nvcc")
    jobs = {}
    for tgt in TARGETS:
        arts = artifacts(tgt)
        text, kernels = translation_unit(arts)
        (d / f"{tgt}.cu").write_text(text)
        jobs[tgt] = (arts, kernels, (d / f"{tgt}.cu", d / tgt, [tgt], tgt in HOST_CODE))
    alone = dict(jobs["sm_86"][0])["fused_epilogue/bf16"]
    (d / "alone.cu").write_text(alone.program_cu)
    jobs["alone"] = ([("alone", alone)], 1, (d / "alone.cu", d / "alone", list(TARGETS), True))
    with ThreadPoolExecutor(2) as pool:
        runs = {key: pool.submit(nvcc, *args) for key, (_, _, args) in jobs.items()}
        return {key: (*jobs[key][:2], runs[key].result()) for key in jobs}


def test_an_artifacts_two_texts_differ_only_in_host_code_after_their_kernel():
    """What lets the translation units compile each kernel once; a pair that differs in its kernel is compiled whole
    (case_texts), so this is a check of speed, not of correctness."""
    (name, art), *_ = artifacts("sm_90")
    head, program, bench = split_host(art.program_cu, art.bench_cu)
    assert "__global__" in head and "int main(" in program and "int main(" in bench, name
    assert split_host(art.program_cu, art.bench_cu.replace("__global__", "__global__ /* changed */", 1)) is None


@pytest.mark.parametrize("key", [*TARGETS, "alone"])
def test_kernels_compile_clean_without_spills_and_with_the_predicted_static_smem(compiled, key):
    arts, kernels, run = compiled[key]
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]
    assert "warning" not in log.lower(), log[-6000:]
    entries = ptxas_entries(log)
    archs = TARGETS if key == "alone" else (key,)
    assert len(entries) == kernels * len(archs)
    for case, kind, arch, spill, smem in entries:
        name, art = arts[case or 0]
        assert spill == 0, f"{name} ({kind}, {arch}) spills {spill} bytes"
        assert smem == art.budget.static_bytes, f"{name} ({kind}, {arch}): ptxas {smem}, budget {art.budget}"
