"""A recursive-descent (precedence-climbing) parser for filter expressions and actions.

Grammar (keywords case-insensitive; lowest precedence first)::

    filter     := expr EOF
    expr       := and { OR and }
    and        := not { AND not }
    not        := NOT not | predicate
    predicate  := sum [ cmp sum | IS [NOT] NULL | [NOT] IN ( sum {, sum} )
                      | [NOT] LIKE sum [ESCAPE 'c'] ]          -- never chained: a = b = c is
                                                                -- a syntax error
    sum        := term { (+|-) term }
    term       := unary { (*|/|%) unary }
    unary      := (+|-) unary | primary
    primary    := NULL | TRUE | FALSE | integer | decimal | 'string' | @param | property
                | newid() | property( sum ) | p( sum ) | EXISTS ( property ) | ( expr )
    cmp        := = | <> | != | < | <= | > | >=

    action     := statement { (,|;) statement } [;]            -- 1 to 32 statements
    statement  := SET property = expr | REMOVE property        -- REMOVE of sys.* is an error

``NOT`` may only start a predicate (``a = NOT b`` is a syntax error; write ``a = (NOT b)``).
Nesting (parentheses, ``NOT``, unary signs, function arguments, IN lists) deeper than
``MAX_DEPTH`` levels is a ``FilterSyntaxError``, so no text can exhaust the stack.

``parse`` and ``parse_action`` raise only ``FilterSyntaxError``, with the offset of the token
where the problem was found.
"""

from __future__ import annotations

from ...exceptions import FilterSyntaxError
from .lexer import EOF, FLOAT, IDENT, INT, KEYWORD, OP, PARAM, STRING, Token, syntax_error, tokenize
from .nodes import (
    Action,
    Arith,
    BoolOp,
    Call,
    Compare,
    Exists,
    In,
    IsNull,
    Like,
    Literal,
    Node,
    Not,
    Param,
    Prop,
    Remove,
    Set,
    Unary,
)

__all__ = ["MAX_DEPTH", "MAX_STATEMENTS", "parse", "parse_action"]

MAX_DEPTH = 64
MAX_STATEMENTS = 32

# Precedence levels.
_OR, _AND, _NOT, _PRED, _ADD, _MUL, _UNARY = 1, 2, 3, 4, 5, 6, 7
_COMPARISONS = frozenset({"=", "<>", "<", "<=", ">", ">="})
_INFIX_OPS = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "%": _MUL}


def _describe(tok: Token) -> str:
    if tok.kind == EOF:
        return "the end of the text"
    if tok.kind == STRING:
        return f"string {tok.value!r}"
    if tok.kind == IDENT:
        return f"name {tok.value[1]!r}"
    if tok.kind == PARAM:
        return f"parameter @{tok.value}"
    return repr(str(tok.value))


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0

    # ------------------------------------------------------------------ token access

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != EOF:
            self.i += 1
        return tok

    def error(self, tok: Token, message: str) -> FilterSyntaxError:
        return syntax_error(self.text, tok.pos, message)

    def unexpected(self, tok: Token, expected: str) -> FilterSyntaxError:
        return self.error(tok, f"expected {expected}, found {_describe(tok)}")

    def is_op(self, tok: Token, op: str) -> bool:
        return tok.kind == OP and tok.value == op

    def is_keyword(self, tok: Token, word: str) -> bool:
        return tok.kind == KEYWORD and tok.value == word

    def expect_op(self, op: str) -> Token:
        tok = self.take()
        if not self.is_op(tok, op):
            raise self.unexpected(tok, repr(op))
        return tok

    # ------------------------------------------------------------------ expressions

    def infix(self) -> tuple[str, int] | None:
        """The infix operator at the cursor and its precedence, if there is one."""
        tok = self.peek()
        if tok.kind == OP:
            if tok.value in _COMPARISONS:
                return tok.value, _PRED
            prec = _INFIX_OPS.get(tok.value)
            return (tok.value, prec) if prec is not None else None
        if tok.kind == KEYWORD:
            word = tok.value
            if word == "OR":
                return word, _OR
            if word == "AND":
                return word, _AND
            if word in ("IS", "IN", "LIKE"):
                return word, _PRED
            if word == "NOT":
                nxt = self.peek(1)
                if nxt.kind == KEYWORD and nxt.value in ("IN", "LIKE"):
                    return word, _PRED
        return None

    def expr(self, min_prec: int, depth: int) -> Node:
        left = self.prefix(min_prec, depth)
        while True:
            found = self.infix()
            if found is None or found[1] < min_prec:
                return left
            op, prec = found
            if prec == _PRED:
                left = self.predicate(left, depth)
                after = self.infix()
                if after is not None and after[1] == _PRED:
                    raise self.error(self.peek(), "comparisons cannot be chained; use parentheses")
                continue
            # A flat chain of every operator of this level (see nodes.py).
            if prec in (_OR, _AND):
                operands = [left]
                while (found := self.infix()) is not None and found[1] == prec:
                    self.take()
                    operands.append(self.expr(prec + 1, depth))
                left = BoolOp(op, tuple(operands), left.pos)
            else:
                rest: list[tuple[str, Node]] = []
                while (found := self.infix()) is not None and found[1] == prec:
                    self.take()
                    rest.append((found[0], self.expr(prec + 1, depth)))
                left = Arith(left, tuple(rest), left.pos)

    def predicate(self, left: Node, depth: int) -> Node:
        tok = self.take()
        if tok.kind == OP:
            return Compare(tok.value, left, self.expr(_ADD, depth), left.pos)
        if tok.value == "IS":
            negated = self.is_keyword(self.peek(), "NOT")
            if negated:
                self.take()
            null = self.take()
            if not self.is_keyword(null, "NULL"):
                raise self.unexpected(null, "NULL")
            return IsNull(left, negated, left.pos)
        negated = tok.value == "NOT"
        if negated:
            tok = self.take()
        if tok.value == "IN":
            self.expect_op("(")
            items = [self.expr(_ADD, depth + 1)]
            while self.is_op(self.peek(), ","):
                self.take()
                items.append(self.expr(_ADD, depth + 1))
            self.expect_op(")")
            return In(left, tuple(items), negated, left.pos)
        pattern = self.expr(_ADD, depth)
        escape: str | None = None
        if self.is_keyword(self.peek(), "ESCAPE"):
            self.take()
            esc = self.take()
            if esc.kind != STRING:
                raise self.unexpected(esc, "a one-character string after ESCAPE")
            if len(esc.value) != 1:
                raise self.error(esc, "the ESCAPE string must be exactly one character")
            escape = esc.value
        return Like(left, pattern, escape, negated, left.pos)

    def prefix(self, min_prec: int, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise self.error(
                self.peek(), f"the expression is nested more than {MAX_DEPTH} levels deep"
            )
        tok = self.take()
        kind = tok.kind
        if kind in (INT, FLOAT, STRING):
            return Literal(tok.value, tok.pos)
        if kind == PARAM:
            return Param(tok.value, tok.pos)
        if kind == IDENT:
            scope, name, bare = tok.value
            if bare and self.is_op(self.peek(), "("):
                return self.call(tok, name.lower(), depth)
            return Prop(scope or "user", name, tok.pos)
        if kind == KEYWORD:
            word = tok.value
            if word == "NULL":
                return Literal(None, tok.pos)
            if word in ("TRUE", "FALSE"):
                return Literal(word == "TRUE", tok.pos)
            if word == "NOT":
                if min_prec > _NOT:
                    raise self.error(tok, "NOT is not allowed here; use parentheses")
                return Not(self.expr(_NOT, depth + 1), tok.pos)
            if word == "EXISTS":
                self.expect_op("(")
                prop = self.property_ref()
                self.expect_op(")")
                return Exists(prop, tok.pos)
        if kind == OP:
            if tok.value == "(":
                inner = self.expr(_OR, depth + 1)
                self.expect_op(")")
                return inner
            if tok.value in ("+", "-"):
                return Unary(tok.value, self.expr(_UNARY, depth + 1), tok.pos)
        raise self.unexpected(tok, "an expression")

    def call(self, tok: Token, name: str, depth: int) -> Node:
        if name == "newid":
            self.take()
            self.expect_op(")")
            return Call("newid", (), tok.pos)
        if name in ("property", "p"):
            self.take()
            arg = self.expr(_ADD, depth + 1)
            self.expect_op(")")
            return Call("property", (arg,), tok.pos)
        raise self.error(tok, f"unknown function {tok.value[1]!r}")

    def property_ref(self) -> Prop:
        tok = self.take()
        if tok.kind != IDENT:
            raise self.unexpected(tok, "a property name")
        scope, name, _ = tok.value
        return Prop(scope or "user", name, tok.pos)

    # ------------------------------------------------------------------ entry points

    def filter(self) -> Node:
        node = self.expr(_OR, 0)
        tok = self.peek()
        if tok.kind != EOF:
            raise self.unexpected(tok, "an operator or the end of the text")
        return node

    def action(self) -> Action:
        statements: list[Set | Remove] = []
        while True:
            if len(statements) == MAX_STATEMENTS:
                raise self.error(
                    self.peek(), f"an action may have at most {MAX_STATEMENTS} statements"
                )
            statements.append(self.statement())
            sep = self.take()
            if sep.kind == EOF or (self.is_op(sep, ";") and self.peek().kind == EOF):
                return Action(tuple(statements), 0)
            if not (self.is_op(sep, ",") or self.is_op(sep, ";")):
                raise self.unexpected(sep, "',' or ';' between statements")

    def statement(self) -> Set | Remove:
        tok = self.take()
        verb = tok.value[1].upper() if tok.kind == IDENT and tok.value[2] else None
        if verb == "SET":
            target = self.property_ref()
            self.expect_op("=")
            return Set(target, self.expr(_OR, 1), tok.pos)
        if verb == "REMOVE":
            target = self.property_ref()
            if target.scope == "sys":
                raise self.error(self.tokens[self.i - 1], "system properties cannot be removed")
            return Remove(target, tok.pos)
        raise self.unexpected(tok, "SET or REMOVE")


def _guarded(text: str, action: bool) -> Node | Action:
    if not isinstance(text, str):
        raise FilterSyntaxError(
            f"a SQL expression must be a str, not {type(text).__name__}", None, None, None
        )
    try:
        parser = _Parser(text)
        return parser.action() if action else parser.filter()
    except RecursionError:  # pragma: no cover - MAX_DEPTH keeps the stack well short of this
        raise syntax_error(text, None, "the expression is nested too deeply") from None


def parse(text: str) -> Node:
    """The syntax tree of a filter expression; raises ``FilterSyntaxError`` for bad text."""
    node = _guarded(text, action=False)
    assert not isinstance(node, Action)
    return node


def parse_action(text: str) -> Action:
    """The syntax tree of an action; raises ``FilterSyntaxError`` for bad text."""
    node = _guarded(text, action=True)
    assert isinstance(node, Action)
    return node
