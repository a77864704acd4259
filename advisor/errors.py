"""One JSON error envelope for every error:
``{"error": {"status": 422, "code": "validation_error", "message": "...", "fields": {"workload.temperature": [...]}}}``.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import json
import logging
import re
from typing import Any

from flask import Flask, Response, jsonify, request
from flask.json.provider import DefaultJSONProvider
from marshmallow import Schema, ValidationError, fields
from sqlalchemy import exc as sa_exc
from werkzeug.exceptions import HTTPException, InternalServerError, UnprocessableEntity

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 32  # the deepest request body any route takes is 5 levels


class ErrorBodySchema(Schema):
    status = fields.Integer(required=True)
    code = fields.String(required=True)
    message = fields.String(required=True)
    fields = fields.Dict(keys=fields.String(), values=fields.List(fields.String()),
                         metadata={"description": "Field path -> messages (validation errors)."})


class ErrorSchema(Schema):
    """Every error response: ``{"error": {"status", "code", "message", "fields"?}}``."""

    error = fields.Nested(ErrorBodySchema, required=True)


def _depth_exceeds(data: Any, limit: int) -> bool:
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def loads_bounded(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` whose every failure is a ``ValueError``: bad syntax, integers of more than 4,300 digits
    (Python's limit), and nesting deeper than ``limit`` (the parser's own recursion limit included)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {limit} levels") from None
    if _brackets(text) > limit and _depth_exceeds(data, limit):  # fewer opening brackets cannot nest deeper
        raise ValueError(f"JSON nested deeper than {limit} levels")
    return data


def _brackets(text: str | bytes) -> int:
    """The opening brackets in a JSON text, those inside strings included: at least its nesting depth."""
    if isinstance(text, str):
        return text.count("[") + text.count("{")
    return text.count(b"[") + text.count(b"{")


class JSONProvider(DefaultJSONProvider):
    """Request bodies through ``loads_bounded`` (a 400, never a 500); responses never hold NaN or Infinity."""

    sort_keys = False

    @staticmethod
    def default(o: Any) -> Any:
        if isinstance(o, datetime.datetime):
            return o.isoformat()  # as marshmallow's DateTime dumps it (Flask's default is an HTTP date)
        return DefaultJSONProvider.default(o)

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads_bounded(s)

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("allow_nan", False)
        return super().dumps(obj, **kwargs)


class InvalidPathId(UnprocessableEntity):
    """A path id that is not made of ASCII digits; raised by the ``id`` URL converter during routing."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.data = {"messages": {"id": [message]}}


class ApiError(Exception):
    """A client error raised by a service: status, machine code, message, optional field messages."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _CODES.get(status, "error")
        self.fields = fields or {}


_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type", 422: "validation_error",
          429: "too_many_requests", 500: "internal_error", 503: "unavailable"}


def field_error(field: str, message: str) -> ApiError:
    return ApiError(422, f"{field}: {message}", fields={field: [message]})


def flatten_messages(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """marshmallow's nested messages -> ``{"workload.temperature": ["..."]}``."""
    if isinstance(messages, dict):
        flat: dict[str, list[str]] = {}
        for key, value in messages.items():
            if key in ("json", "query", "form", "files", "headers", "view_args") and not prefix:
                flat.update(flatten_messages(value, ""))  # flask-smorest wraps by location
                continue
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "_schema":
                path = prefix or "_schema"
            flat.update(flatten_messages(value, path))
        return flat
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, str) for m in messages):
        return {prefix or "_schema": list(messages)}
    if isinstance(messages, (list, tuple)):
        flat = {}
        for item in messages:
            flat.update(flatten_messages(item, prefix))
        return flat
    return {prefix or "_schema": [str(messages)]}


def envelope(status: int, message: str, code: str | None = None, fields: dict[str, list[str]] | None = None):
    body: dict[str, Any] = {"status": status, "code": code or _CODES.get(status, "error"), "message": message}
    if fields:
        body["fields"] = fields
    response = jsonify({"error": body})
    response.status_code = status
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="specadvisor"'
    if status == 503:
        response.headers["Retry-After"] = "5"
    return response


def _summary(fields: dict[str, list[str]]) -> str:
    parts = [f"{name}: {'; '.join(msgs)}" for name, msgs in fields.items()]
    return "Invalid input. " + " | ".join(parts) if parts else "Invalid input."


def handle_http_exception(error: HTTPException):
    data = getattr(error, "data", None) or {}
    messages = data.get("messages") if isinstance(data, dict) else None
    if error.code == 422 and messages:
        fields = flatten_messages(messages)
        return envelope(422, _summary(fields), "validation_error", fields)
    if isinstance(error, InternalServerError):
        return envelope(500, "Internal server error.")
    message = (data.get("message") if isinstance(data, dict) else None) or error.description or error.name
    response = envelope(error.code or 500, message)
    for name, value in error.get_headers():  # e.g. Allow on a 405
        if name.lower() != "content-type":
            response.headers[name] = value
    return response


def unstorable(text: str) -> bool:
    """NUL (0x00), which PostgreSQL text cannot hold, or a lone surrogate, which is not UTF-8 (JSON allows both)."""
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def find_unstorable(data: Any, prefix: str = "") -> str | None:
    """The path of the first string (or key) that no database can store as text, else None."""
    if isinstance(data, str):
        return prefix or "_schema" if unstorable(data) else None
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if unstorable(str(key)):
                return path
            found = find_unstorable(value, path)
            if found:
                return found
    if isinstance(data, (list, tuple)):
        for index, value in enumerate(data):
            found = find_unstorable(value, f"{prefix}.{index}" if prefix else str(index))
            if found:
                return found
    return None


def _plain(raw: bytes, escape: bytes) -> bool:
    """Raw bytes whose every parsed string is storable: ASCII without a NUL and without ``escape``, the only way
    its parser writes any other character (``%`` in a query; ``\\u`` in JSON, whose parser refuses raw control
    characters)."""
    return raw.isascii() and escape not in raw and b"\x00" not in raw


def reject_unstorable_strings() -> None:
    """A client string holding NUL or a lone surrogate is a 422 naming where it is, on every backend."""
    from flask import request

    req = request._get_current_object()  # one look-up of the request, not one per attribute
    query = req.query_string
    pairs = [*req.args.items(multi=True)] if query and not _plain(query, b"%") else []  # repeated keys: every value
    body = None
    if req.environ.get("CONTENT_TYPE"):  # without a Content-Type there is no form and no JSON body
        if req.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
            pairs += req.form.items(multi=True)
        if req.is_json and req.method in ("POST", "PUT", "PATCH") and req.get_data(cache=True):
            body = req.get_json()  # malformed or abusive JSON is a 400 on every route, those that ignore bodies too
        elif req.is_json:
            body = req.get_json(silent=True)
        if body is not None and _plain(req.get_data(cache=True), b"\\u"):
            body = None
    for data in (req.view_args or {}, *({key: value} for key, value in pairs), body):
        field = find_unstorable(data)
        if field:
            raise field_error(field, "must be valid UTF-8 text without NUL (0x00) characters.")


def database_unavailable(error: Exception):
    """A database that is down, hung (connect, statement, lock or pool time-out) or locked: a JSON 503."""
    log.warning("database unavailable: %s", str(error).splitlines()[0][:300])
    return envelope(503, "The database is unavailable or did not answer in time; try again shortly.",
                    "database_unavailable")


# The Swagger UI page (flask-smorest's template) has inline <script> blocks: allow exactly those by hash.
_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S)


def docs_csp(body: bytes) -> str:
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(m).digest()).decode() + "'"
                      for m in _INLINE_SCRIPT.findall(body))
    return (f"default-src 'none'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'self'")


def security_headers(response: Response) -> Response:
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    if request.path == "/v1/docs" and response.mimetype == "text/html":
        response.headers["Content-Security-Policy"] = docs_csp(response.get_data())
        response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")
    return response


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(HTTPException, handle_http_exception)
    app.before_request(reject_unstorable_strings)
    app.after_request(security_headers)
    for db_error in (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError):
        app.register_error_handler(db_error, database_unavailable)

    @app.errorhandler(sa_exc.IntegrityError)
    def _conflict(error: sa_exc.IntegrityError):
        log.info("integrity error: %s", str(error).splitlines()[0][:300])
        return envelope(409, "The request conflicts with a stored row (a unique name or a reference).")

    @app.errorhandler(ApiError)
    def _api_error(error: ApiError):
        return envelope(error.status, error.message, error.code, error.fields)

    @app.errorhandler(ValidationError)
    def _validation_error(error: ValidationError):
        fields = flatten_messages(error.messages)
        return envelope(422, _summary(fields), "validation_error", fields)

    @app.errorhandler(Exception)
    def _unexpected(error: Exception):
        if isinstance(error, HTTPException):
            return handle_http_exception(error)
        log.exception("unhandled error")
        return envelope(500, "Internal server error.")
