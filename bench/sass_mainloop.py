"""What the GPU would execute per K step of the default GEMM kernels: the SASS of each main loop, counted.

    python bench/sass_mainloop.py [SIZE [ARCH]]        # default 4096 sm_90; needs nvcc and cuobjdump

For each precision and kernel form, the default plan at SIZE³ is lowered, compiled (`-O3`, cached) and
disassembled; the main loop (the innermost loop holding MMAs, one K step a trip) is counted: every instruction,
the MMAs and the tile-MACs they do, the operand loads by kind (LDSM, other shared loads, generic loads), the block
barriers, and issue slots per 16×16×16 tile-MAC — the figure the operand path is judged by before a GPU measures
it (bench/README.md, "The operand path"). No timing: a static count, identical on any machine with the same nvcc.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import spatialc
from spatialc.runtime.nvcc import compile_cubin, kernel_ptxas


def _sass_reader():
    """spatialc's SASS reader, or — when an older checkout of spatialc is on PYTHONPATH — this tree's, by path."""
    try:
        import spatialc.runtime.sass as reader

        return reader
    except ImportError:
        path = Path(__file__).parents[1] / "src/spatialc/runtime/sass.py"
        spec = importlib.util.spec_from_file_location("spatialc.runtime.sass", path)
        assert spec and spec.loader
        reader = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = reader  # its dataclasses look their module up there
        spec.loader.exec_module(reader)
        return reader


sass = _sass_reader()


def main(size: int = 4096, arch: str = "sm_90") -> None:
    print(f"default plans at {size}³ for {arch}; spatialc from {Path(spatialc.__file__).parent}")
    head = "| kernel | plan | instrs/step | tile-MACs/step | issue/tile-MAC | LDSM | other LDS | LD | BAR.SYNC | regs |"
    print(head)
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for prec in ("fp16", "bf16", "int8"):
        for form in ("persistent", "general"):
            try:
                p = spatialc.build(spatialc.gemm(size, size, size, prec), arch, form=form)
                art = spatialc.lower(p, form=form)
            except TypeError:  # an older spatialc without forms
                if form != "persistent":
                    continue
                p = spatialc.build(spatialc.gemm(size, size, size, prec), arch)
                art = spatialc.lower(p)
            cubin = compile_cubin(art.kernel_cu, arch)
            c = sass.main_loop_census(sass.disassemble(cubin))
            if c is None:
                print(f"| {prec} {form} | — | not one main loop |")
                continue
            plan = p.plan
            ptx = kernel_ptxas(cubin, art.launch.kernel_name)
            blk = plan.block
            print(
                f"| {prec} {form} | {blk.osh}×{blk.osw}×{blk.ibw}, sub {plan.sub_blocks[0]}×{plan.sub_blocks[1]},"
                f" depth {plan.depth} | {c.instrs} | {c.tile_macs:g} | {c.instrs / c.tile_macs:.2f} | {c.ldsm} |"
                f" {c.other_lds} | {c.generic} | {c.barriers} |"
                f" {ptx.registers if ptx else '?'} |"
            )


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 4096, args[1] if len(args) > 1 else "sm_90")
