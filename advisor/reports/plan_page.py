"""The capacity plan's page (issue 12): the ranking as a table and the monthly cost per option, with and without
speculation, per load level, as one inline SVG (same style, CSP and offline guarantees as the other reports)."""
from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from . import plots
from .formatting import fmt
from .pages import _ENV

MAX_PLOTTED = 14  # GPU × TP rows per panel (the cheapest)


def _monthly(option: dict[str, Any] | None, i: int) -> float | None:
    if not option or not option.get("feasible") or i >= len(option.get("loads") or []):
        return None
    return plots._num(option["loads"][i].get("monthly_usd"))


def cost_svg(plan: dict[str, Any], salt: str = "plan") -> str:
    """Monthly $ per GPU × TP, without (grey) and with speculation (blue), one panel per load level; log scale."""
    options = plan.get("options") or []
    loads = plan.get("loads_requests_per_second") or []
    pairs: dict[str, dict[str, Any]] = {}
    for o in options:
        pairs.setdefault(f"{o.get('gpu')} TP{o.get('tensor_parallel_size')}", {})[o.get("mode")] = o
    with plots._style(salt):
        cols = min(max(len(loads), 1), 3)
        rows_n = math.ceil(max(len(loads), 1) / cols)
        height = min(max(len(pairs), 1), MAX_PLOTTED) * 0.28 + 1.2
        fig = Figure(figsize=(3.4 * cols + 1.2, height * rows_n))
        axes = fig.subplots(rows_n, cols, squeeze=False).ravel()
        if not loads or not pairs:
            plots._no_data(fig, axes[0], "no options")
            return plots._to_svg(fig, "monthly cost: no data")
        for i, load in enumerate(loads):
            ax = axes[i]
            costs = {name: (_monthly(p.get("baseline"), i), _monthly(p.get("speculative"), i))
                     for name, p in pairs.items()}
            ranked = sorted(costs, key=lambda n: min((c for c in costs[n] if c is not None), default=math.inf))
            ranked = ranked[:MAX_PLOTTED][::-1]
            y = list(range(len(ranked)))
            base = [costs[n][0] for n in ranked]
            spec = [costs[n][1] for n in ranked]
            ax.barh([v + 0.2 for v in y], [b or 0 for b in base], height=0.38, color=plots.COLOR_BASELINE,
                    label="without speculation")
            ax.barh([v - 0.2 for v in y], [s or 0 for s in spec], height=0.38, color=plots.COLOR_SPECULATIVE,
                    label="with speculation")
            finite = [v for v in base + spec if v]
            ax.set_xlim(0, max(finite) * 1.4 if finite else 1)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${plots._short(v)}"))
            for yy, b, s in zip(y, base, spec):
                for offset, value in ((0.2, b), (-0.2, s)):
                    text = f"${plots._short(value)}" if value else "infeasible"
                    x = value if value else 0
                    ax.annotate(text, (x, yy + offset), xytext=(2, 0), textcoords="offset points", va="center",
                                fontsize=6, color="black" if value else plots.COLOR_BAD)
            ax.set_yticks(y)
            ax.set_yticklabels(ranked, fontsize=7)
            ax.set_title(f"{load:g} req/s", fontsize=9)
            ax.set_xlabel("monthly $")
            ax.grid(axis="y", visible=False)
        for ax in axes[len(loads):]:
            ax.set_visible(False)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=7, frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 0.97))
        return plots._to_svg(fig, "monthly cost per option, with and without speculation, per load level")


def plan_page(plan: dict[str, Any]) -> str:
    req = plan.get("request") or {}
    q = (plan.get("slo") or {}).get("percentile")
    title = f"Capacity plan #{plan.get('id')}: {req.get('target_model')} at " + \
        ", ".join(f"{x:g}" for x in plan.get("loads_requests_per_second") or []) + " req/s"
    pct = f"{q:g}" if isinstance(q, (int, float)) else ""
    gpus: dict[str, dict[str, Any]] = {}
    for o in plan.get("options") or []:
        src = o.get("sources") or {}
        gpus.setdefault(o.get("gpu"), {"gpu": o.get("gpu"), "gpu_hour_usd": o.get("gpu_hour_usd"),
                                       "price_source": src.get("gpu_hour_usd"), "step_time": src.get("step_time")})
    return _ENV.get_template("plan.html").render(
        plan=plan, req=req, title=title, gpus=list(gpus.values()), q=pct,
        plot=Markup(cost_svg(plan, salt=f"plan{plan.get('id', '')}")))
