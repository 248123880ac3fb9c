"""Parsing command-line values: durations and message properties (pure functions).

Durations are accepted the ways people write them: seconds (``30``, ``1.5``), compact units
(``1m30s``, ``500ms``, ``2h``, ``1d12h``, ``1w``), ISO-8601 (``PT1M30S``, ``P1DT2H``), the
.NET TimeSpan form Service Bus tools print (``00:01:30``, ``1.00:00:00``), and, where the
setting allows it, ``never`` (Service Bus' maximum duration).

Entities: ``parse_entity`` turns a command's ENTITY argument and ``--subscription`` option into
an ``EntityRef``: a queue, or a topic's subscription (``TOPIC/Subscriptions/SUB`` as an
argument, or ``--subscription TOPIC/SUB``, or ``TOPIC --subscription SUB``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .._models import MAX_DURATION

__all__ = [
    "EntityRef",
    "format_duration",
    "parse_duration",
    "parse_entity",
    "parse_property",
    "parse_seconds",
]

_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_NUMBER = r"\d+(?:\.\d+)?"
_COMPACT_PART = re.compile(rf"({_NUMBER})(ms|w|d|h|m|s)", re.IGNORECASE)
_COMPACT = re.compile(rf"^(?:{_NUMBER}(?:ms|w|d|h|m|s))+$", re.IGNORECASE)
_ISO = re.compile(
    rf"^P(?:(?P<w>{_NUMBER})W)?(?:(?P<d>{_NUMBER})D)?"
    rf"(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?$",
    re.IGNORECASE,
)
_TIMESPAN = re.compile(r"^(?:(?P<d>\d+)\.)?(?P<h>\d{1,2}):(?P<m>\d{2}):(?P<s>\d{2}(?:\.\d+)?)$")
_NEVER = frozenset({"never", "max", "infinite", "inf"})


def parse_duration(text: str, *, allow_never: bool = False) -> timedelta:
    """A duration from ``text``; raises ``ValueError`` with a message fit for the user."""
    raw = text.strip()
    low = raw.lower()
    if low in _NEVER:
        if allow_never:
            return MAX_DURATION
        raise ValueError(f"{text!r}: this setting needs a finite duration")
    seconds: float | None = None
    if re.fullmatch(_NUMBER, raw):
        seconds = float(raw)
    elif _COMPACT.match(raw):
        seconds = sum(float(n) * _UNITS[u.lower()] for n, u in _COMPACT_PART.findall(raw))
    elif (iso := _ISO.match(raw)) and raw.upper() not in ("P", "PT") and not raw.endswith("T"):
        seconds = sum(float(iso[k] or 0) * _UNITS[k] for k in ("w", "d", "h", "m", "s"))
    elif span := _TIMESPAN.match(raw):
        seconds = sum(float(span[k] or 0) * _UNITS[k] for k in ("d", "h", "m", "s"))
    if seconds is None:
        raise ValueError(
            f"{text!r} is not a duration (examples: 30, 1.5, 1m30s, 500ms, PT1M30S, 00:01:30"
            + (", never)" if allow_never else ")")
        )
    return timedelta(seconds=seconds)


def parse_seconds(text: str) -> float:
    """A duration in seconds (for waits and intervals)."""
    return parse_duration(text).total_seconds()


def format_duration(value: timedelta) -> str:
    """``1m30s``-style text; ``never`` for Service Bus' maximum duration."""
    if value >= MAX_DURATION:
        return "never"
    total = value.total_seconds()
    if total < 1:
        return f"{total * 1000:g}ms"
    out = []
    rest = total
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        count = int(rest // size)
        if count:
            out.append(f"{count}{unit}")
            rest -= count * size
    if rest or not out:
        out.append(f"{round(rest, 3):g}s")
    return "".join(out)


def parse_property(text: str) -> tuple[str, Any]:
    """``key=value`` into an application property.

    The value is read as JSON when that gives a number, ``true``/``false``, ``null`` or a
    quoted string (``n=5`` is the integer 5, ``n='"5"'`` the string "5"); anything else is
    taken as the literal string.
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"{text!r} is not key=value")
    try:
        parsed = json.loads(value)
    except ValueError:
        return key, value
    if parsed is None or isinstance(parsed, bool | int | float | str):
        return key, parsed
    return key, value


# Service Bus's subscription path; topic names may contain '/', subscription names may not.
_SUBSCRIPTION_PATH = re.compile(r"^(?P<topic>.+)/subscriptions/(?P<sub>[^/]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class EntityRef:
    """What a message command works on: a queue (``subscription`` is None) or the subscription
    ``subscription`` of the topic ``name``."""

    name: str
    subscription: str | None = None

    @property
    def is_subscription(self) -> bool:
        return self.subscription is not None

    @property
    def path(self) -> str:
        """The entity path: the queue name, or ``TOPIC/Subscriptions/SUB``."""
        if self.subscription is None:
            return self.name
        return f"{self.name}/Subscriptions/{self.subscription}"

    def __str__(self) -> str:
        return self.path


def parse_entity(entity: str | None, subscription: str | None = None) -> EntityRef:
    """The queue or subscription named by a command's ENTITY argument and ``--subscription``.

    * ``orders``: the queue ``orders``;
    * ``orders/Subscriptions/big`` (any case): the subscription ``big`` of the topic ``orders``;
    * ``--subscription orders/big`` (or ``orders/Subscriptions/big``) without ENTITY: the same;
    * ``orders --subscription big``: the same (ENTITY is then the topic).

    Raises ``ValueError`` with a message fit for the user.
    """
    entity = entity.strip() if entity is not None else None
    if subscription is not None:
        sub = subscription.strip()
        if entity:
            if _SUBSCRIPTION_PATH.match(entity):
                raise ValueError(f"{entity!r} is already a subscription path: drop --subscription")
            if "/" in sub:
                raise ValueError(
                    f"give TOPIC --subscription SUB or --subscription TOPIC/SUB, not both "
                    f"(got {entity!r} and {sub!r})"
                )
            return _subscription(entity, sub)
        if found := _SUBSCRIPTION_PATH.match(sub):
            return _subscription(found["topic"], found["sub"])
        topic, sep, name = sub.rpartition("/")
        if not sep:
            raise ValueError(
                f"--subscription {sub!r}: give TOPIC/SUB (or the topic as the ENTITY argument)"
            )
        return _subscription(topic, name)
    if not entity:
        raise ValueError("give a queue name, TOPIC/Subscriptions/SUB, or --subscription TOPIC/SUB")
    if found := _SUBSCRIPTION_PATH.match(entity):
        return _subscription(found["topic"], found["sub"])
    return EntityRef(entity)


def _subscription(topic: str, name: str) -> EntityRef:
    topic, name = topic.strip(), name.strip()
    if not topic or not name:
        raise ValueError(f"{topic}/{name}: both the topic and the subscription name are needed")
    return EntityRef(topic, name)
