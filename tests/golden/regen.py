"""The golden CUDA texts of a few small programs. `python tests/golden/regen.py` rewrites them after a deliberate
change to the printer; review the diff before committing it. tests/lower/test_lower_golden.py compares against them."""

from __future__ import annotations

import sys
from pathlib import Path

import spatialc
from spatialc.frontend import bias, relu, requant
from spatialc.lower.cuda.persistent.kernel import lower

HERE = Path(__file__).parent

# name → (m, n, k, precision, target, build options). Small, and each shows a different printer path.
CASES: dict[str, tuple[int, int, int, str, str, dict]] = {
    "int8_one_tile_sm86": (16, 16, 16, "int8", "sm_86", {}),
    "int8_strided_items_sm86": (48, 40, 48, "int8", "sm_86", {"sites": 2, "placement": "round_robin"}),
    "fp16_fused_pipelined_sm86": (64, 64, 64, "fp16", "sm_86", {"block": (2, 4, 2), "sites": 2}),
    "bf16_sub_blocks_depth1_sm90": (
        64,
        128,
        32,
        "bf16",
        "sm_90",
        {"block": (2, 4, 1), "sub_blocks": (2, 2), "depth": 1},
    ),
    "fp16_dynamic_rings_sm90": (64, 64, 128, "fp16", "sm_90", {"block": (4, 4, 4), "depth": 4}),
    # The fused epilogue: bias read by column, relu and requant applied as the accumulators are read back, int8 out.
    "int8_bias_relu_requant_sm86": (
        64,
        72,
        32,
        "int8",
        "sm_86",
        {"block": (2, 4, 1), "sites": 2, "epilogue": [bias(), relu(), requant(0.004, -3)]},
    ),
}


def render(name: str) -> str:
    """The program_cu text of case `name`."""
    m, n, k, prec, tgt, kw = CASES[name]
    options = {key: v for key, v in kw.items() if key != "epilogue"}
    p = spatialc.build(spatialc.gemm(m, n, k, prec, epilogue=kw.get("epilogue", ())), tgt, **options)
    return lower(p, spatialc.target(tgt)).program_cu


def path(name: str) -> Path:
    return HERE / f"{name}.cu"


def main() -> int:
    for name in CASES:
        path(name).write_text(render(name))
        print(f"wrote {path(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
