"""The public entry points. Heavy parts (lowering, emulation, GPU launch) are imported when first used."""

from __future__ import annotations

from typing import Any

from .frontend import gemm
from .ir.nodes import SpatialProgram
from .target import SpatialTarget, target

__all__ = ["build", "emulate", "evaluate", "gemm", "lower", "run"]


def build(
    program: SpatialProgram,
    target_name: str | SpatialTarget = "sm_90",
    *,
    block: tuple[int, int, int] | None = None,
    sub_blocks: tuple[int, int] | None = None,
    depth: int | None = None,
    sites: int | None = None,
    placement: str | None = None,
) -> SpatialProgram:
    """tile → place → schedule → verify; returns the verified program."""
    from .passes.pipeline import build as run_passes

    return run_passes(program, target(target_name), block=block, sub_blocks=sub_blocks, depth=depth, sites=sites,
                      placement=placement)


def evaluate(program: SpatialProgram, inputs: dict[str, Any], **kwargs: Any):
    """The exact result of `program` on `inputs` (name → numpy array), from the reference interpreter."""
    from .interp.evaluate import evaluate as run_interpreter

    return run_interpreter(program, inputs, **kwargs)


def lower(program: SpatialProgram, target_name: str | SpatialTarget | None = None):
    """The CUDA artifact of a verified program (target defaults to the one it was built for)."""
    from .lower.cuda.persistent import lower as lower_cuda

    return lower_cuda(program, target(target_name or program.target))


def emulate(artifact, inputs: dict[str, Any], mode: str = "late", **kwargs: Any):
    """Run the artifact's `program_cu` on the CPU through the host emulation; returns C."""
    from .runtime.emulate import emulate as run_emulation

    return run_emulation(artifact, inputs, mode=mode, **kwargs)


def run(artifact, a, b, **params: Any):
    """Run the artifact's kernel on a GPU; numpy, torch or CuPy arrays in, the same library out."""
    from .runtime.launch import run as run_gpu

    return run_gpu(artifact, a, b, **params)


gemm = gemm
