"""Service Bus SQL rule filters and actions: a pure (Ray-free) parser, compiler and evaluator.

Entry points: ``compile_filter(text, parameters)`` -> ``CompiledFilter`` (``evaluate(record)``
gives TRUE/FALSE/``None`` = UNKNOWN or raises ``FilterEvaluationError``; ``matches(record)``
is True only for TRUE); ``compile_action(text, parameters)`` -> ``CompiledAction``
(``apply(record)``); ``parse``/``parse_action`` for the syntax tree; the azure-servicebus rule
models and ``fan_out`` in ``rules``. Text is parsed and compiled once into nested closures.

Semantics (shared with the reference evaluator of the differential test; the first part is
the project's decision record, the second the choices this implementation made where it was
silent; both are binding):

Values: NULL; bool; int (Int64); float (double); str; uuid.UUID; datetime (aware UTC from
system times; naive datetimes in properties/parameters are taken as UTC); bytes (only from
properties; bytearray/memoryview count as bytes; only = and <>). Any other Python value in a
property can only be tested with IS NULL / EXISTS; every operator on it is TypeMismatch.

Lexical: keywords AND OR NOT IS NULL IN LIKE ESCAPE EXISTS TRUE FALSE are case-insensitive and
reserved (use ``[and]`` for such a property). SET/REMOVE are recognised only at the start of an
action statement and newid/property/p only directly before ``(``; elsewhere they are ordinary
property names (``p = 1``). Identifiers: regular ``[A-Za-z_][A-Za-z0-9_]*`` (ASCII), or
``[delimited]`` (``]]`` escapes ``]``), or ``"quoted"`` (``""`` escapes ``"``); empty ``[]``
/ ``""`` are syntax errors. An optional scope prefix ``sys.`` or ``user.`` (any case, no spaces
around the dot) may precede any of the three forms (``sys.[Label]``); any other dotted name
(``a.b``) is a syntax error, and ``[sys.Label]`` is the *user* property named ``sys.Label``.
Strings: single quotes, ``''`` escapes. Numbers: digits = Int64 (a literal above 2**63-1 is a
syntax error, so ``-9223372036854775808`` is one too); ``1.5``, ``.5``, ``5.``, ``1e3``,
``1.5E-2`` = double (overflowing to infinity is a syntax error); a number immediately followed
by a letter, digit or ``_`` (``1abc``, ``1e``, ``1and``) is a syntax error. Whitespace is
anything Python's ``\\s`` matches. No comments (``--1`` is minus minus one). ``@name``
parameters: names case-insensitive; the dict keys may be written with or without the ``@``;
every ``@name`` used must be supplied, and every supplied value must be NULL, bool, Int64 int,
float, str, bytes, uuid.UUID or datetime, else FilterSyntaxError (position None for a bad
value or a key given twice ignoring case); unused parameters are allowed. Text longer than
1,024 characters is a FilterSyntaxError (position 1024); so is nesting more than 64 levels
deep (parentheses, NOT, unary signs, function arguments and IN lists each count a level).

Grammar: see ``parser``. Notably: comparisons, IS NULL, IN and LIKE do not chain
(``a = b = c``, ``a IS NULL = TRUE`` are syntax errors); ``NOT`` may only start a predicate
(``a = NOT b`` is a syntax error); IS [NOT] NULL, IN, LIKE, comparisons take any arithmetic
expression on their left; IN elements, LIKE patterns, property() arguments are arithmetic
expressions (use parentheses for a predicate); ``x IN ()`` is a syntax error; the ESCAPE
operand must be a string literal of exactly one character; EXISTS takes a property name only;
TRUE, FALSE, NULL, EXISTS(..), parameters may appear wherever a value can.

Properties: unscoped or ``user.`` names are user properties, looked up case-insensitively
(``str.lower()`` equality; the first matching key in dict order wins); missing = NULL.
``sys.`` names (any case) map to MessageRecord fields: MessageId, CorrelationId, To, ReplyTo,
Label and Subject (subject), SessionId, ReplyToSessionId, ContentType, PartitionKey,
SequenceNumber, DeliveryCount, EnqueuedTimeUtc (datetime), ScheduledEnqueueTimeUtc (datetime
or NULL), TimeToLive (float seconds or NULL), Size. Any other sys. name is an evaluation error
MissingSystemProperty, raised when evaluated (also inside EXISTS and IS NULL); a listed one
holding None is NULL. ``property(x)``/``p(x)``: x is evaluated; NULL gives NULL; a non-string
is TypeMismatch; a string starting ``sys.`` (any case) names a system property, one starting
``user.`` names the user property after the prefix, any other string is a user property name
taken verbatim (no brackets or quotes interpreted). EXISTS(user prop): the key is present
(even holding None); EXISTS(sys.X): its value is not None.

Evaluation order: every operand of every operator is evaluated, left to right, before the
operator is applied -- there is NO short-circuit: ``FALSE AND 1/0 = 1`` raises DivideByZero,
``TRUE OR 5`` raises NotBoolean, ``x IN (1, 1/0)`` raises even when x = 1 or x is NULL.
The first error raised in that order is the result.

Three-valued logic: AND: FALSE if any operand is FALSE, else UNKNOWN if any is UNKNOWN, else
TRUE; OR: TRUE dominates, then UNKNOWN; NOT UNKNOWN = UNKNOWN. AND, OR and NOT operands must
be bool or NULL, else NotBoolean. ``x IS NULL`` is TRUE iff x is NULL/missing (never UNKNOWN).
Comparisons, arithmetic, unary signs and LIKE with a NULL operand give UNKNOWN/NULL before
any type check (``NULL + 'a'`` is NULL, ``'a' LIKE NULL`` is UNKNOWN). ``x [NOT] IN (..)``:
x NULL -> UNKNOWN; otherwise x is compared with each non-NULL element using = (a pair that =
cannot compare is TypeMismatch, even if another element matches); TRUE if any is equal, else
UNKNOWN if an element is NULL, else FALSE; NOT IN negates TRUE/FALSE. A filter's top-level
result must be bool or NULL (UNKNOWN), else NotBoolean; it matches only when TRUE.

Types: int op int -> int, checked against Int64 (Overflow), ``/`` truncates toward zero,
``%`` has the sign of the dividend, ``/`` or ``%`` by int zero is DivideByZero (MIN / -1
overflows; MIN % -1 is 0). int with float -> float (the int converted to double); float ``/``
by zero gives +-inf (sign of dividend times sign of the zero) or nan for 0/0 and nan/0; float
``%`` is C# fmod (sign of the dividend; x % 0, inf % y -> nan). ``+`` on two strings
concatenates; any other arithmetic on str, bool, bytes, uuid, datetime is TypeMismatch. Unary
+/- on numbers only (-MIN is Overflow). Comparisons: numbers by value (mixed int/float compare
as doubles); str with str ordinal (Python ordering); datetime with datetime (all six); bool
with bool, bytes with bytes, uuid with uuid, and uuid with str (``str(uuid)`` against the
string, both lower-cased) with = and <> only; ``!=`` is ``<>``; every other pair or operator is
TypeMismatch. NaN compares per IEEE (``nan = nan`` is FALSE, ``nan <> nan`` TRUE).
LIKE: both sides str, else TypeMismatch; ``%`` any sequence, ``_`` exactly one character
(including newline); matching is case-sensitive over the whole string; with ESCAPE 'c', c
followed by any character makes that character literal, and a c at the very end of the
pattern matches c itself. newid() is a fresh uuid4 per evaluation.

Actions: ``SET name = expr`` / ``REMOVE name``, separated by exactly one ``,`` or ``;`` (one
trailing ``;`` allowed, a trailing ``,`` or ``;;`` is a syntax error), 1 to 32 statements.
Statements run in order and each sees the effects of the earlier ones; apply is all or nothing
(on an error the record is unchanged). SET on a user property updates the first key matching
case-insensitively (keeping its spelling), else adds the name as written; the value is stored
as evaluated (NULL -> None; a uuid or datetime stays one). SET sys.X for X in MessageId,
CorrelationId, To, ReplyTo, Label/Subject, SessionId, ReplyToSessionId, ContentType takes a str
or NULL (else TypeMismatch); SET sys.ScheduledEnqueueTimeUtc is ignored (as Service Bus
ignores it in a subscription; its value is still evaluated, and its errors raised); SET of
another listed system property is ReadOnlySystemProperty,
of an unlisted one MissingSystemProperty (both at apply time, after evaluating the value).
REMOVE deletes every key matching case-insensitively (absent: no error); REMOVE sys.X is a
syntax error. The right-hand side is a full expression (``SET b = a > 1`` stores a bool).

Errors: FilterSyntaxError (``position``: 0-based offset of the offending token, the length of
the text for an unexpected end; ``text``) and FilterEvaluationError (``type_name`` one of
TypeMismatch, DivideByZero, Overflow, MissingSystemProperty, NotBoolean,
ReadOnlySystemProperty). Nothing else escapes parsing or compiling, whatever the text.
"""

from __future__ import annotations

from .actions import CompiledAction, compile_action
from .compiler import CompiledFilter, compile_filter
from .nodes import Action, Node
from .parser import MAX_DEPTH, MAX_STATEMENTS, parse, parse_action
from .rules import (
    DEFAULT_RULE_NAME,
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
    fan_out,
    matches,
)

__all__ = [
    "DEFAULT_RULE_NAME",
    "MAX_DEPTH",
    "MAX_STATEMENTS",
    "Action",
    "CompiledAction",
    "CompiledFilter",
    "CorrelationRuleFilter",
    "FalseRuleFilter",
    "Node",
    "RuleFilter",
    "RuleProperties",
    "SqlRuleAction",
    "SqlRuleFilter",
    "TrueRuleFilter",
    "compile_action",
    "compile_filter",
    "fan_out",
    "matches",
    "parse",
    "parse_action",
]
