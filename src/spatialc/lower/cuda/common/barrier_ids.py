"""The named barriers a kernel prints (`bar.sync id, n` and `bar.arrive id, n`), checked before printing: a CTA has
barriers 0 to 15, 0 being __syncthreads' own, and two users of one id would count in each other's phases (a hang, or
a phase completing early) where nothing else would show it. Each form names its users by what they are for: the
general form's engines (1 + the engine's index, `engine_barrier`), and in the sm_90a form the consumer warpgroups'
staging boxes (`sm90a/staging.OUT_BARRIER` + the warpgroup) and the ping-pong's turns (`sm90a/pingpong.py`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...errors import BarrierClash

SYNCTHREADS = 0  # the block's own barrier (__syncthreads): no named use
NAMED_MAX = 15  # the last of a CTA's sixteen


def engine_barrier(index: int) -> int:
    """The named barrier of the general form's engine `index` (its threads meet there: `spatialc_engine_sync`)."""
    return 1 + index


def engine_barriers(engines: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Each engine's barrier, by the engine's name and index (the general form's order of engines)."""
    return {f"engine {i} ({name})": (engine_barrier(i),) for i, name in enumerate(engines)}


def check_barrier_ids(uses: Mapping[str, Iterable[int]]) -> None:
    """Refuse `uses` (each user's barrier ids) unless every id is 1 to 15 and no two users share one."""
    owner: dict[int, str] = {}
    for user, ids in uses.items():
        for i in ids:
            if not SYNCTHREADS < i <= NAMED_MAX:
                raise BarrierClash(i, (user,))
            if i in owner:
                raise BarrierClash(i, (owner[i], user))
            owner[i] = user
