"""Memoization of the cost model's pure functions of inputs that repeat across scenarios (catalog specs, engine
fits, acceptance words): computed once, shared by later answers. The cached values are frozen dataclasses (and
read-only arrays), as the uncached calls' results already were where they came from the catalog's caches."""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def cached_when_hashable(maxsize: int) -> Callable[[F], F]:
    """``functools.lru_cache`` for a pure function whose positional arguments hash on most calls (frozen specs,
    names, numbers) and not on some (a calibration run's or a measured profile's fits hold lists): those calls are
    computed each time. The arguments are hashed once per call (lru_cache would hash frozen dataclasses twice: to
    test, then to key). Bounded: at ``maxsize`` entries the cache starts over."""

    def decorate(fn: F) -> F:
        results: dict[tuple, Any] = {}

        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            try:
                return results[args]
            except KeyError:
                value = fn(*args)
                if len(results) >= maxsize:
                    results.clear()
                results[args] = value
                return value
            except TypeError:  # an unhashable argument
                return fn(*args)

        wrapper.cache_clear = results.clear  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def cached_by_identity(maxsize: int) -> Callable[[F], F]:
    """A pure function of frozen objects that do not hash (step-time fits hold their covariance as lists), cached
    per argument objects: the same objects (a catalog spec's or an engine profile's cached fits) give the value
    computed the first time. The entry holds its arguments, so no id is reused while it lives."""

    def decorate(fn: F) -> F:
        results: dict[tuple[int, ...], tuple[tuple, Any]] = {}

        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            key = tuple(map(id, args))
            hit = results.get(key)
            if hit is not None and all(a is b for a, b in zip(hit[0], args)):
                return hit[1]
            value = fn(*args)
            if len(results) >= maxsize:
                results.clear()
            results[key] = (args, value)
            return value

        wrapper.cache_clear = results.clear  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
