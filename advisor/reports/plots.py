"""Server-side plots as inline SVG strings (matplotlib, Agg backend, no pyplot global state).

Every function takes plain dicts/lists (the stored answer's sub-objects), tolerates missing keys and returns
an ``<svg class="plot" …>`` element without the XML prolog, ready to be inlined in HTML. Text is kept as SVG
``<text>`` (no embedded fonts, no external references), so pages render offline.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

COLOR_BASELINE = "#6b7280"
COLOR_SPECULATIVE = "#2563eb"
COLOR_BAND = "#93c5fd"
COLOR_GOOD = "#15803d"
COLOR_BAD = "#b91c1c"
SEGMENT_COLORS = ("#1e3a8a", "#7c3aed", "#0891b2", "#67e8f9", "#9ca3af", "#e5e7eb", "#fcd34d")

FULL_SIZE_IN = (6.4, 3.6)
SMALL_SIZE_IN = (3.2, 2.0)

_RC: dict[str, Any] = {
    "svg.fonttype": "none",  # text stays text: small, searchable, no glyph outlines
    "text.parse_math": False,  # "$ / 1M tokens" is a label, not mathtext
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


@contextmanager
def _style(salt: str) -> Iterator[None]:
    """rcParams for one plot; ``salt`` makes clip-path/marker ids unique when several SVGs share a page."""
    with matplotlib.rc_context({**_RC, "svg.hashsalt": salt}):
        yield


def _to_svg(fig: Figure, label: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", text[text.find("<svg") :], count=1, flags=re.S)
    attributes = f'<svg class="plot" role="img" aria-label="{_attr(label)}" '
    return svg.replace("<svg ", attributes, 1).strip()


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def _num(value: Any) -> float | None:
    """A finite float, or None (missing, None, bool, NaN, non-numeric)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _first_num(data: dict[str, Any], keys: Sequence[str]) -> float | None:
    for key in keys:
        number = _num(data.get(key))
        if number is not None:
            return number
    return None


def _pair(data: Any, key: str) -> float | None:
    return _num(data.get(key)) if isinstance(data, dict) else None


def _log2_axis(ax: Axes) -> None:
    """Log-2 x axis with plain numbers (no mathtext: parse_math is off)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _no_data(fig: Figure, ax: Axes, message: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color=COLOR_BASELINE)


def _label_bar_ends(ax: Axes, values: Sequence[float | None], positions: Sequence[float], unit: str) -> None:
    for y, value in zip(positions, values):
        if value is not None:
            ax.annotate(f" {_short(value)}{unit}", (value, y), va="center", ha="left", fontsize=8)


def _short(value: float) -> str:
    magnitude = abs(value)
    if value == int(value) and magnitude < 1e4:
        return f"{int(value):,}"
    if magnitude >= 1e6:
        return f"{value / 1e6:.2f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.1f}k"
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# --- speedup over concurrency -------------------------------------------------------------------------------
def speedup_curve_svg(
    curve: list[dict[str, Any]] | None,
    break_even_concurrency: float | None = None,
    workload_concurrency: float | None = None,
    *,
    small: bool = False,
    salt: str = "speedup",
) -> str:
    """Speedup (expected, low–high band) over concurrency; a line at 1.0; break-even and workload marked."""
    points = sorted(
        (
            (c, s, _num(p.get("low")), _num(p.get("high")))
            for p in (curve or [])
            if isinstance(p, dict)
            for c, s in [(_num(p.get("concurrency")), _num(p.get("speedup")))]
            if c is not None and s is not None
        ),
        key=lambda point: point[0],
    )
    with _style(salt):
        fig = Figure(figsize=SMALL_SIZE_IN if small else FULL_SIZE_IN)
        ax = fig.add_subplot()
        if not points:
            _no_data(fig, ax, "no speedup curve in this answer")
            return _to_svg(fig, "speedup over concurrency: no data")
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        lows = [p[2] if p[2] is not None else p[1] for p in points]
        highs = [p[3] if p[3] is not None else p[1] for p in points]
        ax.fill_between(
            xs, lows, highs, color=COLOR_BAND, alpha=0.5, linewidth=0, label="interval (low–high)"
        )
        ax.plot(
            xs, ys, color=COLOR_SPECULATIVE, marker="o", markersize=2.5 if small else 3.5, label="expected"
        )
        ax.axhline(1.0, color=COLOR_BASELINE, linestyle="--", linewidth=1, label="no speedup (1.0)")
        if min(xs) > 0 and max(xs) / min(xs) >= 8:
            _log2_axis(ax)
        be = _num(break_even_concurrency)
        if be is not None and be > 0:
            ax.axvline(be, color=COLOR_BAD, linestyle=":", linewidth=1.2)
            ax.plot(
                [be],
                [1.0],
                marker="D",
                color=COLOR_BAD,
                markersize=4 if small else 6,
                label=f"break-even ≈ {_short(be)}",
            )
        wc = _num(workload_concurrency)
        if wc is not None and wc > 0 and not small:
            ax.axvline(
                wc, color=COLOR_GOOD, linestyle="-.", linewidth=1, label=f"workload concurrency {_short(wc)}"
            )
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("speedup ×")
        if not small:
            ax.legend(loc="lower left", fontsize=7, framealpha=0.85)
        fig.tight_layout()
        return _to_svg(fig, "speedup over concurrency")


# --- latency split ------------------------------------------------------------------------------------------
def latency_split_svg(latency_ms: dict[str, Any] | None, salt: str = "latency") -> str:
    """Stacked horizontal bars: prefill + decode time per request, baseline vs speculative."""
    latency_ms = latency_ms if isinstance(latency_ms, dict) else {}
    rows = [
        (label, latency_ms.get(key) if isinstance(latency_ms.get(key), dict) else {})
        for label, key in (("speculative", "speculative"), ("baseline", "baseline"))
    ]
    prefill = [_pair(part, "prefill") for _, part in rows]
    decode = [_pair(part, "decode") for _, part in rows]
    totals = [_pair(part, "total") for _, part in rows]
    with _style(salt):
        fig = Figure(figsize=(FULL_SIZE_IN[0], 2.6))
        ax = fig.add_subplot()
        if all(v is None for v in prefill + decode + totals):
            _no_data(fig, ax, "no latency split in this answer")
            return _to_svg(fig, "latency split: no data")
        positions = [0.0, 1.0]
        prefill_ms = [v or 0.0 for v in prefill]
        decode_ms = [v or 0.0 for v in decode]
        ax.barh(positions, prefill_ms, color="#f59e0b", label="prefill (TTFT)", height=0.5)
        ax.barh(
            positions[1:],
            decode_ms[1:],
            left=prefill_ms[1:],
            color=COLOR_BASELINE,
            label="decode, baseline",
            height=0.5,
        )
        ax.barh(
            positions[:1],
            decode_ms[:1],
            left=prefill_ms[:1],
            color=COLOR_SPECULATIVE,
            label="decode, speculative",
            height=0.5,
        )
        ends = [t if t is not None else p + d for t, p, d in zip(totals, prefill_ms, decode_ms)]
        _label_bar_ends(ax, ends, positions, " ms")
        ax.set_yticks(positions, [label for label, _ in rows])
        ax.set_xlabel("request latency (ms)")
        share = _num(latency_ms.get("prefill_share"))
        title = "Latency per request: prefill vs decode"
        ax.set_title(f"{title} (prefill {share * 100:.0f} %)" if share is not None else title)
        ax.set_xlim(0, max(ends) * 1.22 if max(ends) > 0 else 1)
        ax.legend(loc="lower right", fontsize=7)
        ax.grid(axis="y", visible=False)
        fig.tight_layout()
        return _to_svg(fig, "latency split prefill vs decode")


# --- VRAM budget --------------------------------------------------------------------------------------------
TARGET_KV_KEYS = ("target_kv_gb", "kv_target_gb", "kv_used_target_gb", "target_kv_used_gb")
DRAFT_KV_KEYS = ("draft_kv_gb", "kv_draft_gb", "kv_used_draft_gb", "draft_kv_used_gb")
VRAM_KEYS = ("vram_gb", "total_gb", "memory_gb")


def _kv_used_gb(memory: dict[str, Any]) -> tuple[float | None, float | None]:
    """(target KV GB, drafter KV GB) at the workload's concurrency: explicit keys, else kv_space − headroom
    split by the two caches' bytes per token; (None, None) when the answer does not say."""
    target, draft = _first_num(memory, TARGET_KV_KEYS), _first_num(memory, DRAFT_KV_KEYS)
    if target is not None or draft is not None:
        return target, draft
    kv_space, headroom = _num(memory.get("kv_space_gb")), _num(memory.get("headroom_gb"))
    if kv_space is None or headroom is None:
        return None, None
    used = kv_space - headroom
    per_token_target = _num(memory.get("kv_bytes_per_token_target")) or 0.0
    per_token_draft = _num(memory.get("kv_bytes_per_token_draft")) or 0.0
    if per_token_target + per_token_draft <= 0:
        return used, None
    return used * per_token_target / (per_token_target + per_token_draft), used * per_token_draft / (
        per_token_target + per_token_draft
    )


def vram_total_gb(memory: dict[str, Any], gpu_memory_utilization: float | None = None) -> float | None:
    total = _first_num(memory, VRAM_KEYS)
    usable, utilization = _num(memory.get("usable_gb")), _num(gpu_memory_utilization)
    if total is None and usable is not None and utilization:
        total = usable / utilization
    return total


def vram_segments_gb(
    memory: dict[str, Any], gpu_memory_utilization: float | None = None
) -> list[tuple[str, float]]:
    """The VRAM budget per GPU as (label, GB) segments in stacking order; both KV caches split when known."""
    kv_space = _num(memory.get("kv_space_gb"))
    target_kv, draft_kv = _kv_used_gb(memory)
    segments = [
        ("target weights", _num(memory.get("target_weights_gb"))),
        ("drafter weights", _num(memory.get("draft_weights_gb"))),
        ("activations / CUDA graphs", _num(memory.get("activation_reserve_gb"))),
    ]
    if target_kv is None and draft_kv is None:
        segments.append(("KV cache space (both caches)", kv_space))
    else:
        used = (target_kv or 0.0) + (draft_kv or 0.0)
        free = max(kv_space - used, 0.0) if kv_space is not None else _num(memory.get("headroom_gb"))
        segments += [
            ("target KV cache (in use)", target_kv),
            ("drafter KV cache (in use)", draft_kv),
            ("free KV space (headroom)", free),
        ]
    usable, total = _num(memory.get("usable_gb")), vram_total_gb(memory, gpu_memory_utilization)
    if usable is not None and total is not None:
        segments.append(("outside vLLM's share (1 − gpu_memory_utilization)", total - usable))
    return [(label, gb) for label, gb in segments if gb is not None and gb > 0]


def vram_budget_svg(
    memory: dict[str, Any] | None, gpu_memory_utilization: float | None = None, salt: str = "vram"
) -> str:
    """One stacked horizontal bar of the GPU memory budget (GB per GPU), with vLLM's usable share marked."""
    memory = memory if isinstance(memory, dict) else {}
    segments = vram_segments_gb(memory, gpu_memory_utilization)
    with _style(salt):
        fig = Figure(figsize=(FULL_SIZE_IN[0], 2.8))
        ax = fig.add_subplot()
        if not segments:
            _no_data(fig, ax, "no memory budget in this answer")
            return _to_svg(fig, "VRAM budget: no data")
        left = 0.0
        for (label, gb), color in zip(segments, SEGMENT_COLORS * 2):
            ax.barh(
                [0],
                [gb],
                left=left,
                color=color,
                edgecolor="white",
                height=0.5,
                label=f"{label}: {gb:.1f} GB",
            )
            left += gb
        usable, total = _num(memory.get("usable_gb")), vram_total_gb(memory, gpu_memory_utilization)
        for x, text, style, y in ((usable, "usable by vLLM", "--", 0.3), (total, "VRAM", "-", -0.3)):
            if x is not None and x > 0:
                ax.axvline(x, color="black", linewidth=1, linestyle=style)
                ax.annotate(f"{text} {x:.1f} GB ", (x, y), ha="right", va="center", fontsize=7)
        ax.set_ylim(-0.45, 0.45)
        ax.set_yticks([])
        ax.set_xlabel("GB per GPU")
        ax.set_xlim(0, max(left, total or 0.0) * 1.02)
        fits = memory.get("fits")
        verdict = "" if fits is None else ("fits" if fits else "does NOT fit")
        mc_base, mc_spec = (
            _num(memory.get("max_concurrency_baseline")),
            _num(memory.get("max_concurrency_speculative")),
        )
        detail = (
            f" · max concurrency {_short(mc_base)} without → {_short(mc_spec)} with drafter"
            if mc_base is not None and mc_spec is not None
            else ""
        )
        ax.set_title(f"VRAM budget {verdict}{detail}".strip(), color=COLOR_BAD if fits is False else "black")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=2, fontsize=7, frameon=False)
        ax.grid(axis="y", visible=False)
        fig.tight_layout()
        return _to_svg(fig, "VRAM budget")


# --- TCO ----------------------------------------------------------------------------------------------------
def tco_svg(tco: dict[str, Any] | None, salt: str = "tco") -> str:
    """Two panels, without vs with speculation: $ per 1M output tokens and monthly $ (GPUs on the bars)."""
    tco = tco if isinstance(tco, dict) else {}
    per_million = tco.get("usd_per_million_output_tokens") or {}
    monthly = tco.get("monthly_usd") or {}
    gpus = tco.get("gpus_needed") or {}
    labels = ("without", "with speculation")
    keys = ("baseline", "speculative")
    with _style(salt):
        fig = Figure(figsize=FULL_SIZE_IN)
        ax_tokens, ax_month = fig.subplots(1, 2)
        panels = ((ax_tokens, per_million, "$ / 1M output tokens", ""), (ax_month, monthly, "monthly $", ""))
        drawn = 0
        for ax, data, title, _ in panels:
            values = [_pair(data, key) for key in keys]
            if all(v is None for v in values):
                _no_data(fig, ax, f"{title}: not computed")
                continue
            drawn += 1
            heights = [v or 0.0 for v in values]
            bars = ax.bar(labels, heights, color=[COLOR_BASELINE, COLOR_SPECULATIVE], width=0.6)
            for bar, value, key in zip(bars, values, keys):
                gpu_count = _pair(gpus, key) if data is monthly else None
                text = "—" if value is None else f"${_short(value)}"
                if gpu_count is not None:
                    text += f"\n{_short(gpu_count)} GPU{'' if gpu_count == 1 else 's'}"
                ax.annotate(
                    text,
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
            ax.set_title(title)
            ax.set_ylim(0, max(heights) * 1.3 if max(heights) > 0 else 1)
            ax.grid(axis="x", visible=False)
        savings = _num(tco.get("monthly_savings_usd"))
        if savings is not None:
            word = "saves" if savings >= 0 else "costs"
            text = (
                f"TCO: speculation {word} ${_short(abs(savings))} per month"
                if abs(savings) >= 0.5
                else "TCO: same monthly cost (same number of GPUs for this load)"
            )
            fig.suptitle(
                text,
                color=COLOR_GOOD if savings >= 0.5 else (COLOR_BAD if savings <= -0.5 else "black"),
                fontsize=9,
            )
        fig.tight_layout()
        return _to_svg(fig, "TCO with and without speculation" if drawn else "TCO: no data")


# --- calibration --------------------------------------------------------------------------------------------
@dataclass
class Series:
    """One line of a calibration plot: measured points and, when known, the fitted values at the same x."""

    label: str
    x: list[float] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)
    fitted: list[float | None] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)  # interval per point, when known (drawn as error bars)
    upper: list[float] = field(default_factory=list)


def calibration_fit_svg(title: str, x_label: str, y_label: str, series: list[Series], salt: str) -> str:
    """Measured points (markers) against fitted values (lines) for one probe."""
    with _style(salt):
        fig = Figure(figsize=(FULL_SIZE_IN[0] * 0.75, FULL_SIZE_IN[1]))
        ax = fig.add_subplot()
        if not any(s.x for s in series):
            _no_data(fig, ax, "no numeric measurements")
            return _to_svg(fig, f"{title}: no data")
        colors = matplotlib.colormaps["tab10"]
        for index, s in enumerate(series):
            color = colors(index % 10)
            order = sorted(range(len(s.x)), key=lambda i: s.x[i])
            ax.plot(
                [s.x[i] for i in order],
                [s.measured[i] for i in order],
                linestyle="none",
                marker="o",
                markersize=4,
                color=color,
                label=s.label,
            )
            if s.lower and len(s.lower) == len(s.x) == len(s.upper):
                ax.errorbar(s.x, s.measured, yerr=[[m - lo for m, lo in zip(s.measured, s.lower)],
                                                   [hi - m for m, hi in zip(s.measured, s.upper)]],
                            linestyle="none", color=color, linewidth=0.8, capsize=2)
            fitted = [(s.x[i], s.fitted[i]) for i in order if i < len(s.fitted) and s.fitted[i] is not None]
            if fitted:
                ax.plot(
                    [p[0] for p in fitted],
                    [p[1] for p in fitted],
                    color=color,
                    linewidth=1.2,
                    label="fitted" if s.label == "measured" else None,
                )
        xs = [x for s in series for x in s.x]
        if xs and min(xs) > 0 and max(xs) / min(xs) >= 16:
            _log2_axis(ax)
        ax.set_title(f"{title}\n(markers: measured · lines: fitted)", fontsize=8)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.legend(fontsize=6, loc="best", ncol=2 if len(series) > 3 else 1)
        fig.tight_layout()
        return _to_svg(fig, title)


def residuals_svg(residuals_by_fit: dict[str, list[float]], salt: str = "residuals") -> str:
    """Residuals (measured − fitted) of every fit, by measurement index, one marker colour per fit."""
    with _style(salt):
        fig = Figure(figsize=FULL_SIZE_IN)
        ax = fig.add_subplot()
        cleaned = {
            key: [v for v in map(_num, values) if v is not None] for key, values in residuals_by_fit.items()
        }
        cleaned = {key: values for key, values in cleaned.items() if values}
        if not cleaned:
            _no_data(fig, ax, "no residuals stored")
            return _to_svg(fig, "residuals: no data")
        colors = matplotlib.colormaps["tab10"]
        for index, (key, values) in enumerate(cleaned.items()):
            ax.plot(
                range(len(values)),
                values,
                linestyle="none",
                marker="o",
                markersize=3.5,
                color=colors(index % 10),
                label=key,
            )
        ax.axhline(0.0, color=COLOR_BASELINE, linewidth=1)
        ax.set_title("Residuals of the fits (measured − fitted)")
        ax.set_xlabel("measurement index within the fit")
        ax.set_ylabel("residual")
        ax.legend(fontsize=6, loc="best", ncol=2 if len(cleaned) > 4 else 1)
        fig.tight_layout()
        return _to_svg(fig, "residuals of the fits")
