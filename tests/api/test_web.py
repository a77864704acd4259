"""advisor.web.App: Flask whose per-request coroutine check is answered from code flags for plain functions."""
from __future__ import annotations

import functools
import inspect

import pytest
from flask import Flask

from advisor.web import App


def plain() -> None:
    pass


async def coroutine() -> None:
    pass


class Owner:
    def method(self) -> None:
        pass

    async def coroutine_method(self) -> None:
        pass

    def __call__(self) -> None:
        pass


def _flask(app: App, func):  # noqa: ANN001, ANN202
    """Flask's own answer (or the exception it raises: without asgiref, async_to_sync refuses)."""
    try:
        return Flask.ensure_sync(app, func)
    except RuntimeError as error:
        return type(error), str(error)


def _ours(app: App, func):  # noqa: ANN001, ANN202
    try:
        return app.ensure_sync(func)
    except RuntimeError as error:
        return type(error), str(error)


@pytest.mark.parametrize("func", [plain, Owner().method, functools.partial(plain), Owner(), len, Owner,
                                  coroutine, Owner().coroutine_method, functools.partial(coroutine),
                                  lambda: None])
def test_ensure_sync_answers_as_flask_does(func):
    app = App("test")
    ours, flasks = _ours(app, func), _flask(app, func)
    if inspect.iscoroutinefunction(func):  # Flask's refusal without asgiref, or a new wrapper with it
        assert ours == flasks if isinstance(flasks, tuple) else (type(ours) is type(flasks) and ours is not func)
    else:
        assert ours is flasks


def test_plain_functions_and_methods_are_returned_as_they_are():
    app = App("test")
    bound = Owner().method
    assert app.ensure_sync(plain) is plain
    assert app.ensure_sync(bound) is bound
