"""The ``X-Pagination`` metadata: advisor's Blueprint builds it with one schema instance, a copy of flask-smorest's
logic; this pins the copy to flask-smorest's own implementation so that an upgrade cannot make them drift."""
from __future__ import annotations

import itertools
import json

import flask_smorest
import pytest

from advisor.api import MAX_PAGE, Blueprint

PAGES = (1, 2, 3, 9, 10, 11, 99, 100, 101, MAX_PAGE)
PAGE_SIZES = (1, 2, 3, 10, 100)
ITEM_COUNTS = (0, 1, 2, 3, 9, 10, 11, 99, 100, 101, 999, 1000, 1001, 10_000, 2**31 - 1)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_pagination_metadata_equals_flask_smorest(page_size):
    for page, item_count in itertools.product(PAGES, ITEM_COUNTS):
        ours = Blueprint._make_pagination_metadata(page, page_size, item_count)
        theirs = flask_smorest.Blueprint._make_pagination_metadata(page, page_size, item_count)
        assert ours == theirs, (page, page_size, item_count)
        # the header is the JSON text of the dict: key order is part of it
        assert json.dumps(ours) == json.dumps(theirs), (page, page_size, item_count)


def test_the_comparison_sees_every_field():
    """Edge cases that exercise every key: empty list, first, middle, last and past-the-end pages."""
    meta = Blueprint._make_pagination_metadata
    assert meta(1, 10, 0) == {"total": 0, "total_pages": 0}
    assert meta(2, 10, 25) == {"total": 25, "total_pages": 3, "first_page": 1, "last_page": 3, "page": 2,
                               "previous_page": 1, "next_page": 3}
    assert meta(3, 10, 25) == {"total": 25, "total_pages": 3, "first_page": 1, "last_page": 3, "page": 3,
                               "previous_page": 2}
    assert meta(4, 10, 25) == {"total": 25, "total_pages": 3, "first_page": 1, "last_page": 3}
    assert meta(1, 10, 10) == {"total": 10, "total_pages": 1, "first_page": 1, "last_page": 1, "page": 1}


def test_a_list_page_reads_its_query_without_an_exception_per_absent_field(client, monkeypatch):
    """webargs asks the query string for every field of the list's two schemas; werkzeug's ``MultiDict.get`` built
    and caught a ``BadRequestKeyError`` for each one absent (nine per page, ~20 us of a page's ~300 in process).
    ``QueryArgs`` reads the same values without; a repeated key gives its first value, as before."""
    from werkzeug.exceptions import BadRequestKeyError

    built = []
    original = BadRequestKeyError.__init__
    monkeypatch.setattr(BadRequestKeyError, "__init__",
                        lambda self, *a, **k: built.append(a) or original(self, *a, **k))
    from advisor.schemas import RecommendationListQuerySchema

    page = client.get("/v1/recommendations?page_size=2&page_size=3&method=eagle")
    assert page.status_code == 200 and json.loads(page.headers["X-Pagination"])["total"] == 0
    fields = {*RecommendationListQuerySchema().fields, "page"}
    assert [key for (key, *_) in built if key in fields] == []
    assert client.get("/v1/recommendations/compare?ids=1,2").status_code == 404  # read, then not found
    short = client.get("/v1/recommendations/compare?ids=1&ids=2,3")  # a repeated key: its first value
    assert short.status_code == 422 and "ids" in short.get_data(as_text=True)
