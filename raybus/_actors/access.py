"""Access control on the Ray side: the broker's own token, the handle wrapper that presents a
token with every call, and the ``guarded`` decorator that checks it at the top of an actor method.

How a token travels. Ray calls carry no metadata, so the token is an argument: every guarded
method takes a keyword ``_auth``. Clients never write it: ``AuthedHandle`` wraps an actor handle
and adds ``_auth=<token>`` to each ``.remote`` call (``raybus._connection`` wraps the handles it
gives out when the client has a credential). Actors calling each other present the broker's own
token (``internal_token``), which they read from Ray's internal key-value store — the first actor
of a namespace creates it there.

Trust model (also in the README): the check stops a job that holds actor handles but no valid
token — it gets ``ServiceBusAuthenticationError``/``ServiceBusAuthorizationError`` and changes
nothing. It does not stop code that can read Ray's internal store or the storage path: such code
is already inside the cluster's trust boundary, which Ray's own cluster token authentication
guards.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ray.experimental import internal_kv

from .. import _failpoints, _rpc
from .._clock import SystemClock
from .._core.access import INTERNAL, INTERNAL_PREFIX, Guard, Requirement
from .._lane import LaneServer
from ..auth import AuthorizationRule
from ..exceptions import MessagingEntityNotFoundError, ServiceBusError

__all__ = ["AuthedHandle", "Guarded", "guarded", "internal", "internal_token", "unwrap"]

_KV_NAMESPACE = "raybus"
_tokens: dict[str, str] = {}


def internal_token(namespace: str) -> str:
    """The broker's own token for ``namespace`` (created once, cluster-wide, first writer wins)."""
    token = _tokens.get(namespace)
    if token is None:
        key = f"internal-token/{namespace}".encode()
        internal_kv._internal_kv_put(
            key,
            (INTERNAL_PREFIX + secrets.token_urlsafe(32)).encode(),
            overwrite=False,
            namespace=_KV_NAMESPACE,
        )
        value = internal_kv._internal_kv_get(key, namespace=_KV_NAMESPACE)
        token = _tokens[namespace] = value.decode()
    return token


class _AuthedMethod:
    __slots__ = ("_method", "_token")

    def __init__(self, method: Any, token: Callable[[], str]) -> None:
        self._method = method
        self._token = token

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._method.remote(*args, _auth=self._token(), **kwargs)

    def options(self, **options: Any) -> _AuthedMethod:
        return _AuthedMethod(self._method.options(**options), self._token)

    @property
    def _method_name(self) -> str:
        return str(getattr(self._method, "_method_name", self._method))


class AuthedHandle:
    """An actor handle that presents ``token()`` with every call (see the module docstring).

    It is not meant to cross into other actors: pass ``unwrap(handle)`` there (the token may
    be a key-signed one the other side has no business holding).
    """

    __slots__ = ("_handle", "_token")

    def __init__(self, handle: Any, token: Callable[[], str]) -> None:
        self._handle = handle
        self._token = token

    @property
    def _actor_id(self) -> Any:
        """The wrapped actor's id, the same value every time.

        Clients key their per-actor caches on it (``Connection.sender``/``settler``/
        ``publisher``, grouped settlements). Through ``__getattr__`` it would be a new
        ``_AuthedMethod`` per read, hashed by identity: a new coalescer per call, kept for
        ever, and nothing batched.
        """
        return self._handle._actor_id

    def __getattr__(self, name: str) -> _AuthedMethod:
        # Only actor methods should reach here: an attribute of the handle itself (such as
        # ``_actor_id`` above) must be defined on this class, or it comes back wrapped.
        return _AuthedMethod(getattr(self._handle, name), self._token)

    def __eq__(self, other: object) -> bool:
        return bool(unwrap(other) == self._handle)

    def __hash__(self) -> int:
        return hash(self._handle)

    def __reduce__(self) -> Any:
        raise TypeError("an AuthedHandle must not be pickled: pass unwrap(handle)")


def unwrap(handle: Any) -> Any:
    """The plain Ray handle inside ``handle`` (itself if it is one)."""
    return handle._handle if isinstance(handle, AuthedHandle) else handle


def internal(handle: Any, namespace: str) -> Any:
    """``handle`` presenting the broker's own token (for actor-to-actor calls)."""
    if handle is None:
        return None
    token = internal_token(namespace)
    return AuthedHandle(unwrap(handle), lambda: token)


# How every broker actor (namespace, coordinator, router, partition) is created: named in Ray
# namespace "raybus" (found again by name: ``named_actor``), detached, restarted forever, no
# reserved core, and without Ray's task events. Those record each method call (submitted,
# running, finished) for ``ray list tasks`` and the dashboard, and send them to the GCS: a
# broker makes a call per batch of messages, and Ray Serve turns them off on its own actors
# for the same reason. Measured: a bare async actor's CPU per call 567 -> 473 us pipelined,
# 920 -> 860 us one at a time; a partition's CPU per message, 1 KiB lists of 100 sent,
# received and completed (benchmarks/profile_hot_paths.py e2e, three pairs): 4-5 % less.
BROKER_ACTOR_OPTIONS: dict[str, Any] = {
    "namespace": "raybus",
    "lifetime": "detached",
    "get_if_exists": True,
    "num_cpus": 0,
    "max_restarts": -1,
    "enable_task_events": False,
}


async def named_actor(name: str) -> Any:
    """The raybus actor registered as ``name`` (``ValueError`` if there is none). Every async
    actor looks named actors up through this: the lookup blocks on the GCS, so it runs in a
    thread and the actor's event loop goes on serving meanwhile."""
    import ray

    return await asyncio.to_thread(ray.get_actor, name, namespace="raybus")


M = TypeVar("M", bound=Callable[..., Awaitable[Any]])


def guarded(
    need: Requirement,
    entity: Callable[..., str | None] | None = None,
    *,
    while_broken: bool = False,
    lane: bool = False,
) -> Callable[[M], M]:
    """Check ``_auth`` for ``need`` before running the method.

    The entity checked is the actor's own (``_access_path``) or ``entity(*args)`` for methods of
    namespace-wide actors (None: the namespace itself). The wrapper's signature gains the
    keyword ``_auth`` so Ray accepts it. A method runs only while the actor can serve (see
    ``Guarded._serving``), unless ``while_broken``: rule pushes and fail points must reach an
    actor whose log is damaged too, so that it serves with the current rules once it reads again.
    ``lane``: the method may be called over a lane (``raybus._lane``): the hot path's methods,
    whose arguments and answers are plain data. Methods that pass actor handles or object
    references along (transactions, moves, routes) keep Ray's calls, which track them.
    """

    def deco(fn: M) -> M:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        async def wrapper(self: Any, *args: Any, _auth: Any = None, **kwargs: Any) -> Any:
            guard = self._guard
            if guard is None or self._guard_loading is not None:
                guard = await self._access_guard()
            path = self._access_path() if entity is None else (entity(*args, **kwargs) or "")
            guard.check(_auth, need, path)
            if self._broken is not None and not while_broken:
                await self._serving()
            return await fn(self, *args, **kwargs)

        params = [*sig.parameters.values()]
        params.append(inspect.Parameter("_auth", inspect.Parameter.KEYWORD_ONLY, default=None))
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        # Ray reads a method's signature after ``inspect.unwrap``: hide the original so it
        # sees the one with ``_auth``.
        del wrapper.__wrapped__
        wrapper._lane = lane  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco


def _lane_served(cls: type, name: str) -> bool:
    """Whether a lane serves ``name`` of ``cls``: guarded methods marked ``lane=True``."""
    return bool(getattr(getattr(cls, name, None), "_lane", False))


_served_by: dict[type, frozenset[str]] = {}


def _lane_methods(cls: type) -> frozenset[str]:
    """The names of ``cls``'s methods a lane serves (found once: a class's do not change)."""
    served = _served_by.get(cls)
    if served is None:
        served = _served_by[cls] = frozenset(n for n in dir(cls) if _lane_served(cls, n))
    return served


def _lane_error(exc: BaseException) -> BaseException:
    """What a lane sends back for a call that raised ``exc``: as ``_rpc.translate`` makes
    Ray's errors from this actor's own calls to others, and nothing that is not an
    ``Exception`` (a cancelled call is an internal error to its caller)."""
    from ray.exceptions import RayError

    if isinstance(exc, RayError):
        return _rpc.translate(exc, None)
    if isinstance(exc, Exception):
        return exc
    return ServiceBusError(f"internal broker error: {exc!r}")


class Guarded:
    """Mixin for actors with guarded methods: owns the ``Guard`` and keeps its rules current.

    The namespace actor holds the rules; every other actor fetches a copy on its first call
    (after a restart too) and receives each change through ``set_access``.
    """

    _namespace: str
    _guard: Guard | None = None
    _guard_loading: asyncio.Future[None] | None = None

    def _access_path(self) -> str:
        """The entity path this actor serves ('' for namespace-wide actors)."""
        return ""

    # Set while the actor cannot serve (a partition whose log is damaged, an entity deleted).
    # The guarded wrapper awaits ``_serving`` only while it is set, so the common call pays
    # one attribute check.
    _broken: BaseException | None = None
    # The path of the entity, once it is deleted (``mark_deleted``).
    _deleted: str | None = None

    async def _serving(self) -> None:
        """Raise instead of running a (permitted) method when the actor cannot serve (called
        only while ``_broken`` is set); a partition with a damaged log overrides it."""
        self._raise_if_deleted()

    def _raise_if_deleted(self) -> None:
        if self._deleted is not None:
            raise MessagingEntityNotFoundError(f"{self._deleted!r} was deleted", self._deleted)

    _lane_server: LaneServer | None = None

    async def lane_address(self) -> tuple[str, str, frozenset[str]]:
        """This actor's node, the address of its lane (``raybus._lane``), listening from the
        first ask, and the methods served there (those marked ``lane=True``). Not guarded:
        it answers where to connect, and every call made there presents its token as over
        Ray."""
        import ray

        context = ray.get_runtime_context()
        if self._lane_server is None:
            self._lane_server = LaneServer(self._lane_call, _lane_error)
        address = await self._lane_server.start(context.get_actor_id() or "actor")
        return context.get_node_id(), address, _lane_methods(type(self))

    async def _lane_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name not in _lane_methods(type(self)):
            raise ValueError(f"{name!r} is not a method that can be called over a lane")
        return await getattr(self, name)(*args, **kwargs)

    @guarded(INTERNAL, while_broken=True)
    async def mark_deleted(self) -> None:
        """The namespace deleting this actor's entity, just before it kills the actor.

        ``ray.kill`` returns before the process is gone, and a call that reaches the actor
        meanwhile (a sender holding its handle) would be answered as if nothing happened: a
        message acknowledged into a deleted queue. From this call on every guarded call
        raises ``MessagingEntityNotFoundError``, and waiting receivers are woken to raise it.
        """
        self._deleted = self._access_path()
        if self._broken is None:
            self._broken = MessagingEntityNotFoundError("deleted", self._deleted)
        self._on_deleted()

    def _on_deleted(self) -> None:
        """Wake what waits inside the actor (``mark_deleted``); nothing by default."""

    async def _fetch_access(self) -> tuple[int, tuple[AuthorizationRule, ...]]:
        from .namespace import namespace_actor_name  # import cycle: namespace uses this module

        registry = await named_actor(namespace_actor_name(self._namespace))
        got: tuple[int, tuple[AuthorizationRule, ...]] = await _rpc.call(
            None,
            internal(registry, self._namespace).access_rules,
            retries=_rpc.READ_RETRIES,
        )
        return got

    async def _access_guard(self) -> Guard:
        guard = self._guard
        if guard is not None and self._guard_loading is None:
            return guard
        if self._guard_loading is None:
            self._guard = Guard(internal_token(self._namespace), SystemClock())
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._guard_loading = fut
            try:
                version, rules = await self._fetch_access()
                self._guard.load(version, rules)
                fut.set_result(None)
            except BaseException as exc:
                fut.set_exception(exc)
                self._guard = None
                raise
            finally:
                self._guard_loading = None
                if not fut.done():
                    fut.cancel()
            return self._guard
        await asyncio.shield(self._guard_loading)
        assert self._guard is not None
        return self._guard

    @guarded(INTERNAL, while_broken=True)
    async def set_access(self, version: int, rules: tuple[AuthorizationRule, ...]) -> None:
        """The namespace pushing a change of rules (internal only). Idempotent, and an older
        version than the one held is ignored, so the namespace may push again freely."""
        _failpoints.hit("access.before_set_access")
        guard = await self._access_guard()  # loaded by the check: no remote call
        guard.load(version, rules)

    @guarded(INTERNAL, while_broken=True)
    async def arm_failpoint(self, name: str, mode: str = "exit") -> None:
        """Arm a fail point in this actor (tests; internal only; see ``raybus._failpoints``)."""
        _failpoints.arm(name, mode)
