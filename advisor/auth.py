"""API tokens: random secrets shown once, stored as SHA-256 hashes; ``Authorization: Bearer <token>``."""
from __future__ import annotations

import functools
import hashlib
import secrets
from typing import Callable

from flask import current_app, g, request
from sqlalchemy import select

from .errors import ApiError
from .extensions import db
from .models import ApiToken, utcnow

TOKEN_PREFIX = "sa_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(name: str) -> str:
    """Store a new token for ``name`` and return the secret (the only time it exists in clear)."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    db.session.add(ApiToken(name=name, prefix=secret[:8], token_hash=hash_token(secret)))
    db.session.commit()
    return secret


def revoke_token(prefix: str) -> int:
    rows = db.session.scalars(select(ApiToken).where(ApiToken.prefix == prefix, ApiToken.revoked.is_(False))).all()
    for row in rows:
        row.revoked = True
    db.session.commit()
    return len(rows)


def current_token() -> ApiToken | None:
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    token = db.session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret.strip())))
    if token is None or token.revoked:
        return None
    token.last_used_at = utcnow()
    db.session.commit()
    return token


def token_required(view: Callable | None = None, *, unless_config: str | None = None):
    """Require a valid token; ``unless_config`` names a config flag that opens the view when true."""

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if unless_config and current_app.config.get(unless_config):
                return fn(*args, **kwargs)
            token = current_token()
            if token is None:
                raise ApiError(401, "A valid API token is required: send 'Authorization: Bearer <token>'. "
                                    "Create one with 'advisor create-token NAME'.")
            g.api_token = token
            return fn(*args, **kwargs)

        return wrapper

    return decorator(view) if view is not None else decorator
