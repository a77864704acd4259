"""REST API under /v1: one blueprint per resource."""
from flask_smorest import Page
from werkzeug.exceptions import NotFound
from werkzeug.routing import BaseConverter

from ..errors import InvalidPathId, field_error
from ..schemas import MAX_ID

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

    def __init__(self, collection, page_params) -> None:  # noqa: ANN001
        if page_params.page > MAX_PAGE:
            raise field_error("page", f"Must be less than or equal to {MAX_PAGE}.")
        super().__init__(collection, page_params)

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
