"""Typed integer ids. Each kind of id is its own `int` subclass so a signature says which it takes."""

from __future__ import annotations


class _Id(int):
    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({int(self)})"

    def __str__(self) -> str:
        return str(int(self))

    @property
    def idx(self) -> int:
        """The plain integer, for indexing and printing."""
        return int(self)


class TensorId(_Id):
    __slots__ = ()


class StageId(_Id):
    __slots__ = ()


class BufferId(_Id):
    __slots__ = ()


class SemId(_Id):
    __slots__ = ()


class Site(_Id):
    __slots__ = ()


class ItemId(_Id):
    __slots__ = ()


class LoopVar(_Id):
    __slots__ = ()


class GroupId(_Id):
    __slots__ = ()


# Loop variables with a fixed meaning. ITEM_Y / ITEM_X are never bound by a Loop: they stand for the grid
# coordinates of the item the enclosing ITEM loop is on (or of the site's only item when there is no ITEM loop).
LV_ITEM = LoopVar(0)
LV_ITEM_Y = LoopVar(1)
LV_ITEM_X = LoopVar(2)
LV_SUB_H = LoopVar(3)
LV_SUB_W = LoopVar(4)
LV_K = LoopVar(5)
LV_ROW = LoopVar(6)  # a grouped GEMM's row blocks of one group (a loop whose count is read at run time)
LV_HEAD = LoopVar(7)  # attention: the query heads of an item's KV head, one after another (grouped-query attention)

LOOP_VAR_NAMES = {
    LV_ITEM: "item",
    LV_ITEM_Y: "item_y",
    LV_ITEM_X: "item_x",
    LV_SUB_H: "sh",
    LV_SUB_W: "sw",
    LV_K: "k",
    LV_ROW: "row",
    LV_HEAD: "head",
}


def loop_var_name(v: LoopVar) -> str:
    """The name a loop variable has in listings and emitted code."""
    return LOOP_VAR_NAMES.get(v, f"lv{int(v)}")
