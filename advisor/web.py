"""The app's Flask class: Flask with a cheaper check, on each request, of the functions it calls.

Imported by the app factory only (the cost model and the GPU probes run where Flask is not installed).
"""
from __future__ import annotations

from inspect import CO_COROUTINE
from types import FunctionType, MethodType
from typing import Any, Callable

from flask import Flask


class App(Flask):
    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Flask's own answer for every function, found faster for a plain function or method. Flask asks this of
        each hook, view and decorator layer of every request (about ten times), and ``inspect.iscoroutinefunction``
        unwraps partials and methods in Python each time; a plain ``def`` is answered from its code flags here, as
        inspect would, and anything else (a partial, a callable object, an ``async def``) goes to Flask."""
        target = func.__func__ if type(func) is MethodType else func
        if type(target) is FunctionType and not target.__code__.co_flags & CO_COROUTINE:
            return func
        return super().ensure_sync(func)
