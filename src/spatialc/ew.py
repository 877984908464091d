"""Elementwise expressions, written as Python: `ew.silu(x) * y`, `ew.where(x > 0, x, 0.1 * x)`, `x + ew.col("bias")`.

Every function here is one op of the table (`spatialc.numerics.elementwise.OPS`, where each op's meaning, C and
error bound are defined), made from that table: an op added there is a function here. Operators spell the binary
ops and comparisons (+ − × ÷ **, < <= > >=; `ew.eq` / `ew.ne`, since == decides equality of expressions); numbers are
constants; `ew.inputs(n)` gives the input tensors, `ew.col(name)` a parameter tensor of one value per column (a
bias), `ew.row(name)` one of one value per row (a per-token scale); `ew.row_index()` and `ew.col_index()` are an
element's own row and column in its tensor, as values — what a mask compares (`ew.mask(ew.col_index() <=
ew.row_index(), x)`: x where the test holds, else −∞), placed where a page sits as a column vector is.

    x, gate = ew.inputs(2)
    p = spatialc.elementwise(ew.silu(gate) * x, 4096, 11008, "bf16")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .arguments import finite_number, shown_number
from .errors import ProgramError
from .ir.ids import TensorId
from .ir.ops import MAX_EXPR_NODES, Apply, Arg, Col, Expr, Lit, Pos, VecAxis, expr_size_fault
from .numerics.elementwise import OPS, ElementwiseOp


@dataclass(frozen=True, slots=True)
class ColumnNamed:
    """A broadcast vector before the program names its tensor: the parameter tensor `name`, one value per column
    (`axis` COL: `ew.col`) or per row (ROW: `ew.row`)."""

    name: str
    axis: VecAxis = VecAxis.COL


Node = Arg | Lit | Apply | ColumnNamed | Pos

# What a formula is made of, for the refusals of anything else (`x // 2`, `round(x)`, `math.exp(x)`).
ALLOWED = (
    "a formula is made of numbers, + - * / ** (unary - and abs too), comparisons < <= > >= (ew.eq, ew.ne) and the"
    " ew ops (ew.where, ew.exp, ew.max, …: spatialc.numerics.elementwise)"
)


def _unsupported(what: str) -> Callable[..., Value]:
    """A method of Value for an operator the table has no op of: a ProgramError naming it and what a formula may use."""

    def refuse(*_: Any, **__: Any) -> Value:
        raise ProgramError(f"an elementwise expression has no {what}: {ALLOWED}")

    refuse.__name__ = f"no {what}"
    return refuse


class Value:
    """An elementwise expression under construction."""

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node

    def __repr__(self) -> str:
        return f"ew.Value({self.node!r})"

    def __add__(self, other: Any) -> Value:
        return _call("add", self, other)

    def __radd__(self, other: Any) -> Value:
        return _call("add", other, self)

    def __sub__(self, other: Any) -> Value:
        return _call("sub", self, other)

    def __rsub__(self, other: Any) -> Value:
        return _call("sub", other, self)

    def __mul__(self, other: Any) -> Value:
        return _call("mul", self, other)

    def __rmul__(self, other: Any) -> Value:
        return _call("mul", other, self)

    def __truediv__(self, other: Any) -> Value:
        return _call("div", self, other)

    def __rtruediv__(self, other: Any) -> Value:
        return _call("div", other, self)

    def __pow__(self, other: Any) -> Value:
        return _call("pow", self, other)

    def __rpow__(self, other: Any) -> Value:
        return _call("pow", other, self)

    def __neg__(self) -> Value:
        return _call("neg", self)

    def __abs__(self) -> Value:
        return _call("abs", self)

    def __lt__(self, other: Any) -> Value:
        return _call("lt", self, other)

    def __le__(self, other: Any) -> Value:
        return _call("le", self, other)

    def __gt__(self, other: Any) -> Value:
        return _call("gt", self, other)

    def __ge__(self, other: Any) -> Value:
        return _call("ge", self, other)

    def __pos__(self) -> Value:
        return self

    def __bool__(self) -> bool:
        raise ProgramError("an elementwise expression has no truth value: use ew.where(cond, a, b)")

    def __float__(self) -> float:
        raise ProgramError(f"an elementwise expression has a value per element, not one float (math.exp?): {ALLOWED}")

    def __int__(self) -> int:
        raise ProgramError(f"an elementwise expression has a value per element, not one int: {ALLOWED}")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = getattr(ufunc, "__name__", "a ufunc")
        raise ProgramError(f"numpy's {name} does not apply to an elementwise expression: {ALLOWED}")

    __floordiv__ = __rfloordiv__ = _unsupported("floor division (//)")
    __mod__ = __rmod__ = _unsupported("remainder (%)")
    __divmod__ = __rdivmod__ = _unsupported("divmod")
    __round__ = _unsupported("round()")
    __trunc__ = _unsupported("math.trunc()")
    __floor__ = _unsupported("math.floor()")
    __ceil__ = _unsupported("math.ceil()")
    __matmul__ = __rmatmul__ = _unsupported("matrix product (@)")
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _unsupported("& | ^ (use ew.where)")
    __invert__ = _unsupported("~")
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _unsupported("shift (<< >>)")


def value(x: Any) -> Value:
    """`x` as an expression: an expression as it is, a number as a constant."""
    if isinstance(x, Value):
        return x
    number = finite_number(x)
    if number is None:
        raise ProgramError(f"an elementwise operand is an expression or a finite number, not {shown_number(x)}")
    return Value(Lit(number))


def _call(name: str, *args: Any, params: tuple[float, ...] = ()) -> Value:
    op = OPS[name]
    if len(args) != op.arity:
        raise ProgramError(f"ew.{name} takes {op.arity} operand(s), not {len(args)}")
    return Value(Apply(name, tuple(value(a).node for a in args), params))  # type: ignore[misc]


def _function(op: ElementwiseOp) -> Callable[..., Value]:
    def f(*args: Any, **params: float) -> Value:
        unknown = set(params) - set(op.params)
        missing = [p for p in op.params if p not in params]
        if unknown or missing:
            raise ProgramError(f"ew.{op.name} takes the parameter(s) {', '.join(op.params) or 'none'}")
        for p, v in params.items():
            if finite_number(v) is None:
                raise ProgramError(f"ew.{op.name}'s {p} is a finite number, not {shown_number(v)}")
        return _call(op.name, *args, params=tuple(float(params[p]) for p in op.params))

    f.__name__ = op.name
    f.__doc__ = f"The table's {op.name} (spatialc.numerics.elementwise): {op.arity} operand(s)" + (
        f", parameters {', '.join(op.params)}" if op.params else ""
    )
    return f


for _op in OPS.values():  # one function per op of the table
    globals()[_op.name] = _function(_op)


def inputs(n: int) -> tuple[Value, ...]:
    """The program's input tensors 0 … n − 1, as expressions."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_INPUTS:
        raise ProgramError(f"an elementwise program has 1 to {MAX_INPUTS} inputs, not {n!r}")
    return tuple(Value(Arg(i)) for i in range(n))


def x(i: int) -> Value:
    """Input tensor i."""
    return inputs(i + 1)[i]


def col(name: str) -> Value:
    """The parameter tensor `name`: one value per output column (a bias), float32 (int32 in an int8 program)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ProgramError(f"a column vector is named by an identifier, not {name!r}")
    return Value(ColumnNamed(name))


def row(name: str) -> Value:
    """The parameter tensor `name`: one value per output row (a per-token scale), float32 (int32 in an int8
    program)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ProgramError(f"a row vector is named by an identifier, not {name!r}")
    return Value(ColumnNamed(name, VecAxis.ROW))


def row_index() -> Value:
    """Each element's row in its tensor (one group's rows: a head's query row), as a value: what a mask compares."""
    return Value(Pos(VecAxis.ROW))


def col_index() -> Value:
    """Each element's column in its tensor (a head's key, in attention's scores), as a value."""
    return Value(Pos(VecAxis.COL))


MAX_INPUTS = 16  # tensors one map reads; far past any fused kernel's operands


def check_size(expr: Value) -> None:
    """ProgramError where `expr`, as the tree the IR stores (a part used twice counted twice), is larger or deeper
    than a Map's formula may be (`ir.ops.MAX_EXPR_NODES`, `MAX_EXPR_DEPTH`). Found without recursion and in time
    bounded by the limit, however many times the formula reuses its parts (x * x squared 24 times is 2^25 nodes)."""
    fault = expr_size_fault(expr.node)
    if fault is not None:
        raise ProgramError(
            f"{fault} (each use of a shared part counted): a kernel applies a formula of at most {MAX_EXPR_NODES}"
        )


def resolved(expr: Value, tensor_of: Callable[[str], TensorId]) -> Expr:
    """The IR expression of `expr`, each named vector given its tensor (`tensor_of(name)`); ProgramError where it is
    too large for a Map (`check_size`). Each distinct node is walked once."""
    check_size(expr)
    done: dict[int, Expr] = {}  # by identity: a part the formula uses twice is resolved once

    def walk(node: Node) -> Expr:
        out = done.get(id(node))
        if out is not None:
            return out
        match node:
            case ColumnNamed(name, axis):
                out = Col(tensor_of(name), axis=axis)
            case Apply(name, args, params):
                out = Apply(name, tuple(walk(a) for a in args), params)  # type: ignore[arg-type]
            case _:
                out = node  # type: ignore[assignment]
        done[id(node)] = out
        return out

    return walk(expr.node)


def column_names(expr: Value) -> list[str]:
    """The named vectors of `expr` (column and row vectors), in order of first use."""
    return list(vector_names(expr))


def vector_names(expr: Value) -> dict[str, VecAxis]:
    """The named vectors of `expr`, each with its axis, in order of first use; ProgramError where one name is read
    both as a column vector and as a row vector (one tensor cannot be both)."""
    out: dict[str, VecAxis] = {}
    stack: list[Node] = [expr.node]
    seen: set[int] = set()  # by identity: a part used twice is read once (its names are already in `out`)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ColumnNamed) and out.setdefault(node.name, node.axis) != node.axis:
            raise ProgramError(f"{node.name!r} is read both as a column vector (col) and as a row vector (row)")
        stack.extend(reversed(getattr(node, "args", ())))
    return out


__all__ = ["Value", "col", "col_index", "inputs", "row", "row_index", "value", "x", *OPS]


# ---- an expression as text (the CLI's `spatialc elementwise EXPR`) ---------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mult": "mul", "Div": "div", "Pow": "pow"}
_COMPARE = {"Lt": "lt", "LtE": "le", "Gt": "gt", "GtE": "ge", "Eq": "eq", "NotEq": "ne"}
MAX_TEXT = 4096  # characters of an expression: far past any formula; more is refused before it is parsed
MAX_NODES = 512  # parts of its parsed tree (numbers, names, ops): verify's rule 1 takes 256 nodes of a formula


def parse(text: str, names: tuple[str, ...] | None = None) -> tuple[Value, tuple[str, ...]]:
    """`text`, a Python expression of the table's ops (`silu(g) * x + col(bias)`), as an expression, and the names
    of its inputs: `names` in that order, or every other name it uses, in order of first use. `col(name)` is a
    column vector, `row(name)` a row vector. Nothing in it is run: it is read as a tree and anything but numbers,
    names, the table's ops, + − × ÷ **, unary minus and one comparison is refused by name."""
    import ast

    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ProgramError(f"an elementwise expression is text of at most {MAX_TEXT} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ProgramError(f"the expression {text[:60]!r} is not one: {e.msg} (column {e.offset})") from None
    except (RecursionError, MemoryError):  # Python's own parser gives up on deep nesting
        raise ProgramError(f"the expression {text[:60]!r}… nests too deep; no kernel applies one") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:  # counted without recursion, before anything walks it so
        raise ProgramError(f"an elementwise expression of more than {MAX_NODES} parts; no kernel applies one")
    order: list[str] = list(names) if names is not None else []
    expr = _Reader(order, names is None).read(tree.body)
    return expr, tuple(order)


def parse_outputs(text: str, names: tuple[str, ...] | None = None) -> tuple[Value | dict[str, Value], tuple[str, ...]]:
    """`text` as `parse` reads it — or, where it is assignments `NAME = EXPR; NAME = EXPR` (RoPE's `out1 = x1 * c - x2
    * s; out2 = x2 * c + x1 * s`), a dict of outputs, name → expression, for `spatialc.elementwise` — and the names of
    the inputs, in order of first use over all the formulas unless `names` gives them."""
    import ast

    if not isinstance(text, str) or len(text) > MAX_TEXT or not _assignments(text):
        return parse(text, names)  # (which refuses too long a text, or one nested too deep, in words)
    try:
        tree = ast.parse(text.strip(), mode="exec")
    except SyntaxError as e:
        raise ProgramError(f"the expression {text[:60]!r} is not one: {e.msg} (column {e.offset})") from None
    except (RecursionError, MemoryError):
        raise ProgramError(f"the expression {text[:60]!r}… nests too deep; no kernel applies one") from None
    if not tree.body:
        raise ProgramError("an elementwise expression is a formula, or outputs NAME = EXPR; NAME = EXPR; this is none")
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES * len(tree.body):  # (`max` here is the table's op)
        raise ProgramError(f"an elementwise formula of more than {MAX_NODES} parts; no kernel applies one")
    order: list[str] = list(names) if names is not None else []
    reader = _Reader(order, names is None)
    outputs: dict[str, Value] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            raise ProgramError(
                f"{ast.unparse(node)[:60]!r} is no output: several outputs are written NAME = EXPR; NAME = EXPR"
            )
        name = node.targets[0].id
        if name in outputs:
            raise ProgramError(f"output {name} is assigned twice; each output is one formula")
        outputs[name] = reader.read(node.value)
    return outputs, tuple(order)


def _assignments(text: str) -> bool:
    """Whether `text` is no expression (it may be outputs' assignments: `parse_outputs`)."""
    import ast

    try:
        ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return True
    except (RecursionError, MemoryError):
        return False
    return False


class _Reader:
    """Reads an expression tree into a Value; inputs named in `order` (added to it where `grow`)."""

    def __init__(self, order: list[str], grow: bool) -> None:
        self.order, self.grow = order, grow

    def read(self, node: Any) -> Value:
        import ast

        match node:
            case ast.Constant(value=v) if isinstance(v, int | float) and not isinstance(v, bool):
                return value(v)
            case ast.Name(id=name):
                return self.input(name)
            case ast.UnaryOp(op=ast.USub(), operand=x):
                return -self.read(x)
            case ast.UnaryOp(op=ast.UAdd(), operand=x):
                return self.read(x)
            case ast.BinOp(left=a, op=op, right=b) if type(op).__name__ in _BINARY:
                return _call(_BINARY[type(op).__name__], self.read(a), self.read(b))
            case ast.Compare(left=a, ops=[op], comparators=[b]) if type(op).__name__ in _COMPARE:
                return _call(_COMPARE[type(op).__name__], self.read(a), self.read(b))
            case ast.Call(func=ast.Name(id="col"), args=[ast.Name(id=name)], keywords=[]):
                return col(name)
            case ast.Call(func=ast.Name(id="row"), args=[ast.Name(id=name)], keywords=[]):
                return row(name)
            case ast.Call(func=ast.Name(id=name), args=args, keywords=keywords) if name in OPS:
                params = {k.arg: self.number(k.value, name) for k in keywords}
                return globals()[name](*(self.read(a) for a in args), **params)  # type: ignore[no-any-return]
        import ast as _ast

        shown = _ast.unparse(node)[:60]
        raise ProgramError(
            f"{shown!r} is not part of an elementwise expression: use numbers, input names, the ops"
            f" ({', '.join(OPS)}), col(name), row(name), + - * / **, unary minus and one comparison"
        )

    def number(self, node: Any, op: str) -> float:
        import ast

        negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
        inner = node.operand if negative else node
        if (
            isinstance(inner, ast.Constant)
            and isinstance(inner.value, int | float)
            and not isinstance(inner.value, bool)
        ):
            return -float(inner.value) if negative else float(inner.value)
        raise ProgramError(f"{op}'s parameters are numbers, not {ast.unparse(node)[:40]!r}")

    def input(self, name: str) -> Value:
        if name in OPS or name in ("col", "row"):
            raise ProgramError(f"{name} is an op; call it: {name}(…)")
        if name not in self.order:
            if not self.grow:
                raise ProgramError(f"{name!r} is not one of the inputs {', '.join(self.order)}")
            if len(self.order) == MAX_INPUTS:
                raise ProgramError(f"an elementwise program has at most {MAX_INPUTS} inputs")
            self.order.append(name)
        return Value(Arg(self.order.index(name)))
