"""The journal's async face, derived from its repositories: a method marked `@blocking` is called
as it is from a thread (`journal.pins.live()`), and awaited from the event loop in a worker thread
(`await journal.pins.live.in_thread()`), so SQLite's fsync never blocks the loop. Both are typed
from the method's own signature (ParamSpec): there is no second list of methods to keep."""
from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Concatenate, Coroutine, Generic, ParamSpec, Protocol, Self, TypeVar, overload

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
S = TypeVar("S")


class BlockingCall(Protocol[P, T_co]):
    """A repository method bound to its repository: call it, or await it in a worker thread."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T_co: ...

    def in_thread(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T_co]:
        """The same call in a worker thread (asyncio.to_thread), for the event loop."""
        ...


class _Bound(functools.partial[T]):
    """The method with its repository as first argument (a partial: called from C, no Python frame
    of its own)."""

    async def in_thread(self, *args: Any, **kwargs: Any) -> T:
        # The method itself goes to the thread, as a bound method would: no partial call in between.
        return await asyncio.to_thread(self.func, *self.args, *args, **kwargs)


class blocking(Generic[S, P, T]):
    """Marks a method of a journal repository as a blocking call (a transaction or a read).

    `repo.method(...)` runs it in the calling thread, `await repo.method.in_thread(...)` in a
    worker thread. The bound call is made once per repository and kept in its `__dict__` (as
    functools.cached_property keeps a value), so later lookups are plain attribute reads.
    """

    def __init__(self, fn: Callable[Concatenate[S, P], T]) -> None:
        self._fn = fn
        self._name = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> Self: ...

    @overload
    def __get__(self, obj: S, owner: type[Any] | None = None) -> BlockingCall[P, T]: ...

    def __get__(self, obj: S | None, owner: type[Any] | None = None) -> Self | BlockingCall[P, T]:
        if obj is None:
            return self
        bound: BlockingCall[P, T] = _Bound(self._fn, obj)
        # Kept only where this is the method the instance resolves to (not through super()).
        if getattr(type(obj), self._name, None) is self:
            obj.__dict__[self._name] = bound
        return bound

    def __call__(self, obj: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        """The method called on the class with its repository (`Signals.pending(repo)`)."""
        return self._fn(obj, *args, **kwargs)
