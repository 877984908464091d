"""Read a compiled kernel's SASS: what the GPU will really execute, checked on a machine without one.

`cuobjdump -sass` (the `nvidia-cuda-cuobjdump` wheel, which needs `nvidia-cuda-nvdisasm` beside it, or a CUDA
toolkit's) prints one instruction a line; `Sass` keeps each as (address, predicate, mnemonic, operands) and answers
the questions the operand path is judged by (bench/README.md, "The operand path"): which loads feed the MMAs, which
MMA shape runs, how many barriers a main-loop iteration crosses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpatialError
from ..ir.printer import plural

# One instruction line: /*0ab0*/  @!P1 BRA 0xaa0 ; (modifiers may hold a shape: HGMMA.64x128x16.F32.BF16)
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)\s*([^;]*);")
# mma.sync's (QMMA: sm_89's 8-bit float one), and wgmma's (a warpgroup's asynchronous MMA; QGMMA its 8-bit float one)
MMA = ("HMMA", "IMMA", "QMMA", "HGMMA", "IGMMA", "QGMMA")


class SassError(SpatialError):
    """cuobjdump is missing, or could not read the cubin."""


@dataclass(frozen=True, slots=True)
class Instr:
    addr: int
    predicate: str  # "@!P1", "" when unconditional
    op: str  # the mnemonic with its modifiers: "LDSM.16.MT88.4"
    operands: str

    @property
    def base(self) -> str:
        """The mnemonic without modifiers: "LDSM"."""
        return self.op.split(".", 1)[0]

    @property
    def never(self) -> bool:
        """An instruction under the always-false predicate (`@!PT`): scheduling padding that never executes."""
        return self.predicate == "@!PT"


@dataclass(frozen=True, slots=True)
class Sass:
    instrs: tuple[Instr, ...]

    @staticmethod
    def parse(text: str) -> Sass:
        out = []
        for line in text.splitlines():
            m = _LINE.match(line)
            if m:
                out.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
        return Sass(tuple(out))

    def ops(self, lo: int = 0, hi: int | None = None) -> Counter[str]:
        """How often each mnemonic (with modifiers) executes-or-may in [lo, hi), padding left out."""
        hi = max((i.addr for i in self.instrs), default=0) + 1 if hi is None else hi
        return Counter(i.op for i in self.instrs if lo <= i.addr < hi and not i.never)

    def count(self, prefix: str, lo: int = 0, hi: int | None = None) -> int:
        """Instructions whose mnemonic starts with `prefix` ("IMMA.16832", "LDSM") in [lo, hi)."""
        return sum(n for op, n in self.ops(lo, hi).items() if op == prefix or op.startswith(prefix + "."))

    def loops(self) -> list[tuple[int, int]]:
        """[start, end] address ranges of backward branches: the loops, innermost ones included."""
        out = []
        for i in self.instrs:
            if i.base == "BRA" and not i.never:
                target = re.match(r"(?:`\(\w+\)\s*)?0x([0-9a-f]+)", i.operands)
                if target and int(target.group(1), 16) <= i.addr:
                    out.append((int(target.group(1), 16), i.addr + 1))
        return out

    def main_loops(self) -> list[tuple[int, int]]:
        """The innermost loops that hold tensor-core MMAs: the K loops. Back edges after the kernel's last EXIT are
        none: ptxas lays slow paths out of line there (an mbarrier.try_wait retried after a time-out), and they jump
        back into the body, over the MMAs."""
        last_exit = max((i.addr for i in self.instrs if i.base == "EXIT"), default=None)
        body = [r for r in self.loops() if last_exit is None or r[1] <= last_exit]
        with_mma = [r for r in body if any(self.count(m, *r) for m in MMA)]
        return [r for r in with_mma if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in with_mma)]


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, in a CUDA toolkit, or from NVIDIA's pip wheel (its `nvidia/cu*/bin`)."""
    from .nvcc import find_cuda_tool

    found = find_cuda_tool("cuobjdump")
    if found:
        return found
    for site in sys.path:
        for hit in sorted(Path(site).glob("nvidia/*/bin/cuobjdump")) if site and Path(site).is_dir() else ():
            return str(hit)
    return None


def disassemble(cubin: Path, cuobjdump: str | None = None) -> Sass:
    """The SASS of every kernel in `cubin`."""
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        raise SassError("cuobjdump was not found; pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    env = dict(os.environ)
    # cuobjdump runs nvdisasm, which the wheels put beside it.
    env["PATH"] = f"{Path(tool).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise SassError(f"cuobjdump could not read {cubin.name}: {(proc.stderr or proc.stdout).strip()[:300]}")
    sass = Sass.parse(proc.stdout)
    if not sass.instrs:
        raise SassError(f"cuobjdump printed no instructions for {cubin.name}")
    return sass


# Tile-MACs (16×16×16 multiply-accumulates) one MMA instruction does, by shape.
TILE_MACS = {
    "HMMA.16816": 0.5,
    "HMMA.1688": 0.25,
    "IMMA.16832": 1.0,
    "IMMA.16816": 0.5,
    "IMMA.8816": 0.125,
    "QMMA.16832": 1.0,
}


def tile_macs(counts: Counter[str]) -> float:
    """The 16×16×16 tile-MACs the MMA instructions in `counts` do, per warp: a wgmma (`HGMMA.64x128x16…`) is one
    instruction of each of the warpgroup's four warps for 64·N·K multiply-accumulates."""
    total = 0.0
    for op, n in counts.items():
        gmma = re.match(r"[HIQ]GMMA\.64x(\d+)x(\d+)", op)
        if gmma:
            total += n * 64 * int(gmma.group(1)) * int(gmma.group(2)) / 4096 / 4
        else:
            total += n * TILE_MACS.get(".".join(op.split(".")[:2]), 0.0)
    return total


@dataclass(frozen=True, slots=True)
class LoopCensus:
    """What one trip of a kernel's main loop executes, per warp."""

    instrs: int
    tile_macs: float  # 16×16×16 multiply-accumulates its MMAs do
    mmas: tuple[tuple[str, int], ...]  # each MMA instruction and how often
    ldsm: int
    other_lds: int  # shared loads other than LDSM
    generic: int  # generic (`LD`) loads
    barriers: int  # BAR.SYNC


def main_loop_census(code: Sass) -> LoopCensus | None:
    """The census of `code`'s one main loop; None when not exactly one loop holds MMAs."""
    loops = code.main_loops()
    if len(loops) != 1:
        return None
    lo, hi = loops[0]
    counts = code.ops(lo, hi)
    return LoopCensus(
        sum(counts.values()),
        tile_macs(counts),
        tuple((op, n) for op, n in sorted(counts.items()) if op.split(".")[0] in MMA),
        code.count("LDSM", lo, hi),
        sum(n for op, n in counts.items() if op.split(".")[0] == "LDS"),
        code.count("LD", lo, hi),
        code.count("BAR.SYNC", lo, hi),
    )


def main_loop_summary(artifact, step_macs: float | None = None) -> str:
    """One line on the main loop of an artifact's kernel, compiled for its target here: its instructions, the MMAs
    and the issue slots each tile-MAC takes, operand loads and barriers, registers and spills. `step_macs`, the
    tile-MACs a warp does in one K step, says how many K steps a trip of the loop is (nvcc unrolls short loops)."""
    from .nvcc import compile_cubin, kernel_ptxas

    cubin = compile_cubin(artifact.kernel_cu, artifact.target)
    code = disassemble(cubin)
    ptx = kernel_ptxas(cubin, artifact.launch.kernel_name)
    stack = f", stack {ptx.stack} B" if ptx and ptx.stack else ""  # local memory without spilling
    regs = f"; {ptx.registers} registers, spills {ptx.spill_stores + ptx.spill_loads} B{stack}" if ptx else ""
    c = main_loop_census(code)
    if c is None:
        return f"{len(code.main_loops())} loops hold MMAs (no one main loop to count){regs}"
    mmas = ", ".join(f"{n} {op}" for op, n in c.mmas)
    steps = c.tile_macs / step_macs if step_macs else 1.0
    trip = "one K step a trip" if steps == 1 else f"{steps:g} K steps a trip" if steps > 1 else "part of a K step"
    return (
        f"main loop ({artifact.target}, {trip}, per warp): {c.instrs} instructions, {mmas}"
        f" ({c.tile_macs:g} tile-MACs: {c.instrs / c.tile_macs:.2f} issue slots each), {c.ldsm} LDSM,"
        f" {c.other_lds} other shared loads, {c.generic} generic loads, {plural(c.barriers, 'block barrier')}{regs}"
    )
