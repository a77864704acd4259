"""One JSON error envelope for every error:
``{"error": {"status": 422, "code": "validation_error", "message": "...", "fields": {"workload.temperature": [...]}}}``.
"""
from __future__ import annotations

import logging
from typing import Any

from flask import Flask, jsonify
from marshmallow import ValidationError
from werkzeug.exceptions import HTTPException, InternalServerError

log = logging.getLogger(__name__)


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
    return envelope(error.code or 500, message)


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


def reject_unstorable_strings() -> None:
    """A client string holding NUL or a lone surrogate is a 422 naming where it is, on every backend."""
    from flask import request

    pairs = [*request.args.items(multi=True), *request.form.items(multi=True)]  # repeated keys: every value
    for data in (request.view_args or {}, *({key: value} for key, value in pairs),
                 request.get_json(silent=True) if request.is_json else None):
        field = find_unstorable(data)
        if field:
            raise field_error(field, "must be valid UTF-8 text without NUL (0x00) characters.")


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(HTTPException, handle_http_exception)
    app.before_request(reject_unstorable_strings)

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
