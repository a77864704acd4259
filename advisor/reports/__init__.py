"""Reports: HTML pages with server-side SVG plots for recommendations, comparisons and calibration runs.

``pages`` renders (pure, no Flask); this module holds the two glue functions used outside the web views.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["calibration_dict", "write_report"]


def calibration_dict(run: Any) -> dict[str, Any]:
    """A ``CalibrationRun`` row as the calibration page's input (the API's JSON shape)."""
    from ..schemas import CalibrationRunSchema

    return CalibrationRunSchema().dump(run)


def write_report(rec_id: int, out: Path) -> None:
    """Write recommendation ``rec_id``'s report to ``out`` as one self-contained HTML file (opens offline).

    Needs an app context (the database); raises ``ApiError`` (404) for an unknown id.
    """
    from ..services import recommendations
    from .pages import recommendation_page

    page = recommendation_page(recommendations.as_dict(recommendations.get(rec_id)))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
