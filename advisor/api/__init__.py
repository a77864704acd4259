"""REST API under /v1: one blueprint per resource."""
from flask_smorest import Page


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
        return list(db.session.scalars(query))
