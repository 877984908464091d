"""verify: the one pass that sets `verified`. It proves eight rules, one module each, in this order:

1. `wellformed`  a known target; sane tile, tensor shapes, plan and compute ops; ids resolve, counts and pages are
                 sane, loop bounds fit a C int, reads come from input or parameter tensors and writes go to the
                 output  (IllFormedError)
2. `coverage`    the placement covers every item exactly once, as the ITEM loops say  (CoverageError)
3. `ownership`   each ring has one producer and one consumer engine per site, the ones its stages declare, and is
                 filled from / emptied to its stage's tensor, in that tensor's tile order; accumulators only via
                 their ops  (RingOwnershipError)
4. `depth`       no op moves more pages than its ring holds  (RingDepthError)
5. `balance`     each engine pairs Reserve/Push and Wait/Pop, co-iterating loops balance, every ring ends empty
                 (UnbalancedError)
6. `bounds`      every tile access stays inside its tensor's grid, its rows and its page  (TileBoundsError)
7. `deadlock`    the choreography cannot deadlock  (VerifyDeadlockError; StrongerCheckNeeded where one run cannot
                 tell)
8. `semantics`   the schedule computes what the stages declare: every output tile written once, as the declared
                 epilogue of Σ_k A·B over every k exactly once (an operand computed by an earlier matmul and its
                 chain followed back the same way); for attention, the online softmax recurrence
                 (`attention` and its `attention_*` modules, `recurrence`)  (SemanticError; StrongerCheckNeeded
                 where it cannot follow the data)

Each rule may assume the ones before it: coverage reads only well-formed ids, the deadlock argument rests on rule 3's
one producer and one consumer, and the semantic rule follows pages from producer to consumer through rings that
rules 3–5 have shown to be single-producer, single-consumer and balanced. Every error names the site, engine, op and
buffer it is about. Sites that run the same programs are checked once.

A rule too long for one module spreads over modules named after it (`wellformed_ops`, `deadlock_run`,
`declared_rows`, `engine_ops`, `semantics_value`, …), each module's docstring saying its part; `limits` holds the
bounds rule 1 sets.
"""

from __future__ import annotations

import threading

from ...errors import IllFormedError, VerifyError
from ...ir.index import ProgramIndex
from ...ir.nodes import SpatialProgram
from ...target import SpatialTarget
from .balance import check_balance
from .bounds import check_bounds
from .coverage import check_coverage
from .deadlock import check_deadlock, check_decidable
from .depth import check_depths
from .facts import Programs
from .ownership import check_owners, stage_owners
from .semantics import check_semantics
from .wellformed import check_tables, check_types
from .wellformed_ops import check_ops, check_sem_counts, check_site_groups

__all__ = ["verify"]


def verify(p: SpatialProgram, target: SpatialTarget | None = None) -> SpatialProgram:
    """`p` marked verified, or the first broken rule's error. (The rules are the program's own; `target` only lets
    a program name a target spatialc does not list, the one it is verified for.) A program this function returned
    itself, unchanged since (`_PROVEN`), is returned as it is: `lower` verifies what `build` just did."""
    if _already_proven(p, target):
        return p
    check_types(p)  # 1, first: values of the IR's types, loops nested no deeper than a kernel can print
    try:
        proven = _verify(p, target)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, RecursionError) as e:
        if isinstance(e, VerifyError):
            raise
        # check_types has shown every value to be of its type, so no known program gets here; one the rules did not
        # foresee still ends as one typed error, never as a crash inside the verifier.
        raise IllFormedError(f"the program is not made of spatialc's IR values: {type(e).__name__}: {e}") from None
    _remember(proven, target)
    return proven


# The programs verify returned last, by identity: (the program, held so that its id names no other object; its hash
# then; the target it was verified for). A SpatialProgram is frozen all the way down (frozen dataclasses, tuples,
# enums, numbers, strings: rule 1 shows every value to be of the IR's types), so a program changed after verify — by
# `dataclasses.replace`, `evolve`, a file read again — is another object, and verified anew. The hash, taken again
# on every look-up (well under a millisecond where the rules take several), is there for a program changed in place
# through `object.__setattr__`, which a frozen dataclass cannot stop.
# Each entry also keeps a dict of what later passes worked out from that program (`derived`).
_PROVEN: dict[int, tuple[SpatialProgram, int, SpatialTarget | None, dict]] = {}
_PROVEN_KEPT = 8
_PROVEN_LOCK = threading.Lock()


def _already_proven(p: SpatialProgram, target: SpatialTarget | None) -> bool:
    """Whether `p` is a program verify returned for `target`, and hashes as it did then."""
    held = _held(p)
    return held is not None and held[2] == target


def _held(p: SpatialProgram) -> tuple[SpatialProgram, int, SpatialTarget | None, dict] | None:
    """`p`'s entry in `_PROVEN` where `p` is a program verify returned and hashes as it did then, else None."""
    if type(p) is not SpatialProgram:
        return None
    held = _PROVEN.get(id(p))
    if held is None or held[0] is not p:
        return None
    try:
        return held if hash(p) == held[1] else None
    except TypeError:  # a value put in place after verify that cannot be hashed: not the program that was proven
        return None


def derived(p: SpatialProgram) -> dict | None:
    """A dict that lives as long as verify remembers `p` unchanged, for what a later pass derives from `p` alone
    (the sm_90a form's kernel, which build makes to see whether that form takes its plan, and lower makes again);
    None where `p` is not a program verify returned, or has changed since."""
    held = _held(p)
    return None if held is None else held[3]


def _remember(p: SpatialProgram, target: SpatialTarget | None) -> None:
    """Keep `p` (just proven) among the last `_PROVEN_KEPT` programs verify returned."""
    if type(p) is not SpatialProgram:
        return
    try:
        fingerprint = hash(p)
    except TypeError:
        return
    with _PROVEN_LOCK:  # builds run in threads too (gpucheck's pool)
        _PROVEN.pop(id(p), None)
        _PROVEN[id(p)] = (p, fingerprint, target, {})
        while len(_PROVEN) > _PROVEN_KEPT:
            del _PROVEN[next(iter(_PROVEN))]


def _verify(p: SpatialProgram, target: SpatialTarget | None) -> SpatialProgram:
    check_tables(p, target)  # 1, on the tables: every look-up below resolves
    index = ProgramIndex.of(p)
    programs = Programs(p)
    check_ops(index, programs.distinct())  # 1, on the ops
    check_site_groups(index, (q for progs in programs.listed.values() for q in progs))
    check_sem_counts(index, (q for progs in programs.listed.values() for q in progs))
    programs.gather(index)
    check_coverage(index, programs)  # 2
    distinct = programs.distinct_sites()
    owners = stage_owners(index)
    for site, progs in distinct:
        engines = check_owners(index, site, progs, owners)  # 3
        check_depths(index, site, progs)  # 4
        check_balance(index, site, progs, engines)  # 5
    check_bounds(index, p.plan, programs.runs())  # 6
    for site, progs in distinct:
        check_decidable(index, site, progs)  # 7
    check_deadlock(index, programs.by_site, programs.keys)
    check_semantics(index, programs)  # 8
    return p.evolve(verified=True)
