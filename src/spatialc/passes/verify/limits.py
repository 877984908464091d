"""verify's rule 1, its limits: the most any size, count or parameter of a program may be (what the kernel's C `int`s
and the largest target's shared memory hold), read by the well-formedness checks and by the passes that must stay
within them."""

from __future__ import annotations

from ...numerics.narrow import FLOAT32_MAX as FLOAT32_MAX  # (one definition; named here for the checks)

# The frontend's scalar ops; the interpreter, the host emulation and the kernel's epilogue know no others.
# quantize_multiplier's ranges: a Q31 multiplier, a shift of at most 30 left or 31 right, an int8 zero point.
REQUANT_MULTIPLIER = (0, 2**31 - 1)
REQUANT_SHIFT = (-31, 30)
REQUANT_ZERO_POINT = (-128, 127)
# More items than any placement could list (the coverage rule builds a list of them).
MAX_ITEMS = 2**24
# The kernel counts loops, tiles of a tensor and item ids in C `int`s: every bound it prints must fit one.
MAX_INT = 2**31 - 1
MAX_NESTING = 32  # loops inside loops: far more than any schedule needs, few enough for any walk of them
# An item's side or K step, in tiles: above what any target's shared memory can stage one K step of (about 900
# one-byte tiles), so no plan the tile pass makes is refused, yet an item — and with it a tensor's padding — is small.
MAX_ITEM_SIDE = 1024
# A ring's pages: above the ~900 one-tile pages of one-byte elements the largest shared memory of any target holds.
MAX_RING_DEPTH = 1024
# A page's or an accumulator's tiles: at most an item's, MAX_ITEM_SIDE a side (nothing holds more at once).
MAX_BUFFER_TILES = MAX_ITEM_SIDE * MAX_ITEM_SIDE
MAX_REDUCE_COLS = 2**31 - 1  # a row's logical width: what a tensor's side may be
