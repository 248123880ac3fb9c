"""The syntax tree of filter expressions and actions (what ``parse`` returns).

Nodes are frozen dataclasses; every node carries ``pos``, the 0-based offset of its first
character in the text, so compile-time errors (an unknown parameter) can point at it.
Same-precedence chains (``a OR b OR c``, ``a + b - c``) are flat n-ary nodes rather than
left-deep trees, so evaluating a long chain does not recurse once per operand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "Action",
    "Arith",
    "BoolOp",
    "Call",
    "Compare",
    "Exists",
    "In",
    "IsNull",
    "Like",
    "Literal",
    "Node",
    "Not",
    "Param",
    "Prop",
    "Remove",
    "Set",
    "Unary",
]


@dataclass(frozen=True, slots=True)
class Literal:
    """A constant: NULL (``None``), ``TRUE``/``FALSE``, an Int64, a double or a string."""

    value: Any
    pos: int


@dataclass(frozen=True, slots=True)
class Param:
    """``@name``; ``name`` is lower-cased and without the ``@``."""

    name: str
    pos: int


@dataclass(frozen=True, slots=True)
class Prop:
    """A property reference. ``scope`` is ``"sys"`` or ``"user"``; ``name`` is as written."""

    scope: str
    name: str
    pos: int


@dataclass(frozen=True, slots=True)
class Call:
    """``newid()`` (``name == "newid"``, no args) or ``property(x)``/``p(x)``
    (``name == "property"``, one arg)."""

    name: str
    args: tuple[Node, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Exists:
    """``EXISTS(prop)``."""

    prop: Prop
    pos: int


@dataclass(frozen=True, slots=True)
class Unary:
    """Unary ``+`` or ``-``."""

    op: str
    operand: Node
    pos: int


@dataclass(frozen=True, slots=True)
class Not:
    """``NOT operand``."""

    operand: Node
    pos: int


@dataclass(frozen=True, slots=True)
class BoolOp:
    """``operands[0] AND operands[1] AND ...`` (``op == "AND"``) or the same with ``OR``."""

    op: str
    operands: tuple[Node, ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Arith:
    """``first op1 x1 op2 x2 ...``, left-associative, all ops of one precedence level
    (``+``/``-`` or ``*``/``/``/``%``)."""

    first: Node
    rest: tuple[tuple[str, Node], ...]
    pos: int


@dataclass(frozen=True, slots=True)
class Compare:
    """``left op right`` with op one of ``= <> < <= > >=`` (``!=`` is stored as ``<>``)."""

    op: str
    left: Node
    right: Node
    pos: int


@dataclass(frozen=True, slots=True)
class IsNull:
    """``operand IS [NOT] NULL``."""

    operand: Node
    negated: bool
    pos: int


@dataclass(frozen=True, slots=True)
class In:
    """``operand [NOT] IN (items...)``."""

    operand: Node
    items: tuple[Node, ...]
    negated: bool
    pos: int


@dataclass(frozen=True, slots=True)
class Like:
    """``operand [NOT] LIKE pattern [ESCAPE 'c']``."""

    operand: Node
    pattern: Node
    escape: str | None
    negated: bool
    pos: int


@dataclass(frozen=True, slots=True)
class Set:
    """Action statement ``SET target = value``."""

    target: Prop
    value: Node
    pos: int


@dataclass(frozen=True, slots=True)
class Remove:
    """Action statement ``REMOVE target`` (a user property)."""

    target: Prop
    pos: int


@dataclass(frozen=True, slots=True)
class Action:
    """A whole action: its statements in order."""

    statements: tuple[Set | Remove, ...]
    pos: int


Node: TypeAlias = (
    Literal
    | Param
    | Prop
    | Call
    | Exists
    | Unary
    | Not
    | BoolOp
    | Arith
    | Compare
    | IsNull
    | In
    | Like
)
