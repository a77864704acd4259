"""REST API under /v1: one blueprint per resource."""
from collections.abc import Iterator, Mapping
from typing import Any

import flask_smorest
import marshmallow as ma
from flask_smorest import Page
from webargs import core
from webargs.flaskparser import FlaskParser, is_json_request
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import BadRequest, NotFound
from werkzeug.routing import BaseConverter

from ..errors import InvalidPathId, loads_bounded
from ..schemas import MAX_ID


class QueryArgs(Mapping):
    """A request's query arguments as webargs reads them, without an exception per absent field: werkzeug's
    ``MultiDict.get`` raises and catches a ``BadRequestKeyError`` (an HTTP exception, built with its message) for
    each key it lacks, and webargs asks for every field of the schema (nine on a list page: 20 us of its ~300)."""

    __slots__ = ("args",)

    def __init__(self, args: MultiDict) -> None:
        self.args = args

    def get(self, key: str, default: Any = None) -> Any:
        values = dict.get(self.args, key)  # a MultiDict maps each key to the list of its values, never empty
        return values[0] if values else default

    def getlist(self, key: str) -> list:
        return self.args.getlist(key)

    def __getitem__(self, key: str) -> Any:
        return self.args[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.args)

    def __len__(self) -> int:
        return len(self.args)


class BoundedParser(FlaskParser):
    """webargs' parser with the app's bounded JSON loader: a 5,000-digit integer or a 10,000-level nesting is
    a 400 (webargs' own loader lets those escape as a ValueError or RecursionError, i.e. a 500)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._instances: dict[type, ma.Schema] = {}

    def _get_schema(self, argmap, req):  # noqa: ANN001, ANN202
        """One instance per schema class, not one per request (marshmallow copies every field per instance)."""
        if isinstance(argmap, type) and issubclass(argmap, ma.Schema):
            instance = self._instances.get(argmap)
            if instance is None:
                instance = self._instances[argmap] = argmap()
            return instance
        return super()._get_schema(argmap, req)

    def load_querystring(self, req, schema):  # noqa: ANN001, ANN201
        return self._makeproxy(QueryArgs(req.args), schema)

    def _raw_load_json(self, req):  # noqa: ANN001, ANN202
        if not is_json_request(req):
            return core.missing
        data = req.get_data(cache=True)
        if not data:
            return core.missing
        parsed = req.get_json(silent=True)  # the app's bounded loader, parsed once per request (Flask caches it)
        if parsed is not None:
            return parsed
        try:  # invalid (or a JSON null): parse again for the message
            return loads_bounded(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadRequest(f"Invalid JSON body: {str(exc)[:200]}.") from None


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = BoundedParser()
    PAGINATION_ARGUMENTS_PARSER = BoundedParser()  # one page-parameters schema instance, not one per request

    def paginate(self, pager=None, **kwargs):  # noqa: ANN001, ANN201
        """flask-smorest's pagination with ``page`` bounded (parsed and documented), so OFFSET cannot overflow."""
        decorator = super().paginate(pager, **kwargs)

        def bounded(func):  # noqa: ANN001, ANN202
            wrapper = decorator(func)
            schema = wrapper._apidoc["pagination"]["parameters"]["schema"]  # this decorator's own class
            schema._declared_fields["page"] = ma.fields.Integer(
                load_default=1, validate=ma.validate.Range(min=1, max=MAX_PAGE))
            return wrapper

        return bounded

    def _set_pagination_metadata(self, page_params, result, headers):  # noqa: ANN001, ANN202
        if page_params.item_count == KEYSET_PAGE:  # a keyset page (``after_id``): nothing was counted
            return result, headers
        return super()._set_pagination_metadata(page_params, result, headers)

    @staticmethod
    def _make_pagination_metadata(page: int, page_size: int, item_count: int) -> dict:
        """flask-smorest's ``X-Pagination`` metadata, without its schema pass: flask-smorest builds a new
        PaginationMetadataSchema per request (building a marshmallow schema copies its fields: about a fifth of a
        list page's time) and dumps the dict through it. Every value here is already the int that dump returns, in
        the schema's field order (``tests/api/test_pagination.py`` pins this to flask-smorest's own)."""
        metadata = {"total": item_count, "total_pages": 0}
        if item_count:
            last_page = (item_count - 1) // page_size + 1
            metadata.update(total_pages=last_page, first_page=1, last_page=last_page)
            if page <= last_page:
                metadata["page"] = page
                if page > 1:
                    metadata["previous_page"] = page - 1
                if page < last_page:
                    metadata["next_page"] = page + 1
        return metadata


KEYSET_PAGE = -1  # the item count a view sets for a keyset page: no X-Pagination header
MAX_PAGE = 1_000_000  # page × page_size stays far inside a 64-bit OFFSET


class IdConverter(BaseConverter):
    """``<id:rec_id>``: ASCII digits within the INTEGER column's range. Beyond the range names nothing (404);
    anything else in that path segment (``²``, ``٣``, ``x``) is a 422 naming the id, never an overflow."""

    regex = r"[^/]+"
    part_isolating = True

    def to_python(self, value: str) -> int:
        if not (value.isascii() and value.isdigit()):
            raise InvalidPathId(f"Not a valid id: '{value[:40]}'; give a positive integer.")
        if len(value) > 10 or not 1 <= int(value) <= MAX_ID:
            raise NotFound(f"No resource with id {value[:40]}.")
        return int(value)

    def to_url(self, value: int) -> str:
        return str(int(value))


ID_SCHEMA = {"type": "integer", "minimum": 1, "maximum": MAX_ID}


class SelectPage(Page):
    """flask-smorest pagination over a SQLAlchemy select, counted and sliced in the database."""

    @property
    def item_count(self) -> int:
        from sqlalchemy import func, select

        from ..extensions import db

        return db.session.scalar(select(func.count()).select_from(self.collection.order_by(None).subquery()))

    @property
    def items(self):  # noqa: ANN201
        from ..extensions import db

        query = self.collection.offset(self.page_params.first_item).limit(self.page_params.page_size)
        return list(db.session.execute(query)) if self.rows else list(db.session.scalars(query))

    rows = False  # True: the collection selects columns, items are Row tuples
