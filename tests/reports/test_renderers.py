"""Renderers without the service: plots as inline SVG, pages as complete offline HTML, missing keys as "—"."""

from __future__ import annotations

import re

import pytest

from advisor.reports import pages, plots
from advisor.reports.calibration_data import probe_plots
from advisor.reports.formatting import fmt
from tests.reports.sample import sample_answer, sample_calibration_run

EXTERNAL = re.compile(
    r"<(script|link|img|iframe|object|embed)\b[^>]*(src|href)\s*=\s*[\"']?\s*(https?:)?//", re.I
)


def assert_offline(html: str) -> None:
    assert html.lstrip().startswith("<!DOCTYPE html>")
    assert not EXTERNAL.search(html), EXTERNAL.search(html)
    assert "<script" not in html.lower()  # no JavaScript at all
    assert "@import" not in html and "url(http" not in html
    assert "<?xml" not in html and "<!DOCTYPE svg" not in html


def svg_count(html: str) -> int:
    return len(re.findall(r'<svg class="plot"', html))


@pytest.mark.parametrize(
    "render",
    [
        lambda a: plots.speedup_curve_svg(a["curve"], a["break_even_concurrency"], 8),
        lambda a: plots.speedup_curve_svg(a["curve"], None, None, small=True),
        lambda a: plots.latency_split_svg(a["latency_ms"]),
        lambda a: plots.vram_budget_svg(a["memory"]),
        lambda a: plots.tco_svg(a["tco"]),
    ],
)
def test_plots_are_inline_svg(render):
    svg = render(sample_answer())
    assert svg.startswith('<svg class="plot"') and svg.rstrip().endswith("</svg>")
    assert "<metadata>" not in svg and "<script" not in svg


@pytest.mark.parametrize(
    "render",
    [
        lambda: plots.speedup_curve_svg(None),
        lambda: plots.speedup_curve_svg([{"concurrency": None}]),
        lambda: plots.latency_split_svg(None),
        lambda: plots.latency_split_svg({"baseline": None}),
        lambda: plots.vram_budget_svg({}),
        lambda: plots.tco_svg({"usd_per_million_output_tokens": None}),
        lambda: plots.residuals_svg({}),
        lambda: plots.calibration_fit_svg("t", "x", "y", [], salt="s"),
    ],
)
def test_plots_without_data_say_so(render):
    svg = render()
    assert svg.startswith("<svg") and ("no " in svg or "not computed" in svg)


def test_speedup_plot_marks_break_even_and_formats_log_axis():
    svg = plots.speedup_curve_svg(sample_answer()["curve"], 40.5, 8)
    assert "break-even ≈ 40.5" in svg and "workload concurrency 8" in svg
    assert "mathdefault" not in svg  # log axis ticks are plain numbers


def test_vram_segments_split_both_kv_caches_and_add_up_to_vram():
    segments = dict(plots.vram_segments_gb(sample_answer()["memory"], gpu_memory_utilization=0.92))
    assert list(segments)[:3] == ["target weights", "drafter weights", "activations / CUDA graphs"]
    used = 54.09 - 53.26  # kv_space − headroom, split by bytes per token (131072 : 4096)
    assert segments["target KV cache (in use)"] == pytest.approx(used * 32 / 33)
    assert segments["drafter KV cache (in use)"] == pytest.approx(used / 33)
    assert segments["free KV space (headroom)"] == pytest.approx(53.26)
    assert sum(segments.values()) == pytest.approx(73.6 / 0.92)  # the whole GPU, 80 GB


def test_vram_segments_tolerate_other_shapes():
    explicit = dict(plots.vram_segments_gb({"kv_space_gb": 10, "target_kv_gb": 3, "draft_kv_gb": 1}))
    assert explicit == {
        "target KV cache (in use)": 3,
        "drafter KV cache (in use)": 1,
        "free KV space (headroom)": 6,
    }
    only_space = plots.vram_segments_gb({"target_weights_gb": 16, "kv_space_gb": 50})
    assert only_space == [("target weights", 16.0), ("KV cache space (both caches)", 50.0)]
    assert plots.vram_segments_gb({"target_weights_gb": None, "fits": False}) == []


def test_plot_ids_do_not_collide_between_plots():
    a, b = (plots.speedup_curve_svg(sample_answer()["curve"], salt=s) for s in ("one", "two"))
    ids_a = set(re.findall(r'id="(p[0-9a-f]{10}|m[0-9a-f]{10})"', a))
    ids_b = set(re.findall(r'id="(p[0-9a-f]{10}|m[0-9a-f]{10})"', b))
    assert ids_a and not ids_a & ids_b


def test_recommendation_page_has_verdict_plots_settings_and_provenance():
    html = pages.recommendation_page(sample_answer())
    assert_offline(html)
    assert 'id="decision" data-decision="go">GO<' in html and 'class="card verdict go"' in html
    assert "speedup 1.55× (1.40–1.67) at concurrency 8 clears 1.1" in html
    assert svg_count(html) == 4
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html  # everything from the answer is escaped
    assert "&#34;num_speculative_tokens&#34;: 2" in html  # speculative_config JSON in a <pre>
    assert re.search(
        r'<table id="dynamic-sd">.*?<td class="num">41</td>\s*<td class="num">1,024</td>', html, re.S
    )
    provenance = html.split('<table id="provenance">')[1]
    assert "<code>speedup.expected</code>" in provenance and "prior:eagle/prose" in provenance
    assert '<a href="/v1/calibrations/3/report">calibration:3</a>' in provenance
    assert "<code>gpu.memory_gb</code>" in provenance  # a path only the provenance names
    assert "<code>workload.concurrency</code>" in html.split('<table id="inputs">')[1]


@pytest.mark.parametrize("decision,css", [("no-go", "no-go"), ("calibrate", "calibrate"), (None, "unknown")])
def test_verdict_colours(decision, css):
    assert f'class="card verdict {css}"' in pages.recommendation_page(sample_answer(decision=decision))


def test_sparse_answer_renders_dashes():
    rec = {"id": 1, "scenario": {}, "decision": "calibrate"}
    html = pages.recommendation_page(rec)
    assert_offline(html)
    assert "CALIBRATE" in html and svg_count(html) == 4 and "—" in html


def test_provenance_sources_inherit_prefixes_and_default_to_computed():
    rows = {r.path: r for r in pages.provenance_rows(sample_answer(provenance={"tco": "catalog:H100-SXM"}))}
    assert rows["tco.monthly_usd.baseline"].source == "catalog:H100-SXM"
    assert rows["tco.monthly_usd.baseline"].source_class == "catalog"
    assert rows["speedup.expected"].source == "computed"
    assert rows["curve[3].low"].source == "computed" and rows["curve[3].low"].value == "1.40"
    assert rows["memory.headroom_gb"].source == "computed"


def test_provenance_lists_the_cost_models_paths_first_then_other_numbers():
    rows = pages.provenance_rows(sample_answer())
    paths = [r.path for r in rows]
    assert paths[:2] == ["speedup.expected", "acceptance.mean_acceptance_length"]
    by_path = {r.path: r for r in rows}
    assert by_path["curve[0].speedup"].source == "prior:eagle/prose"
    assert by_path["curve[1].speedup"].source == "default"  # inherits "curve"
    assert by_path["gpu.memory_gb"].value == "—"  # named by the cost model, not in the answer
    assert by_path["tco.gpu_hour_usd"].source_class == "input"
    assert "decision" not in by_path and "reasons" not in by_path  # only numbers unless the model names them


def test_comparison_page_columns_rows_and_small_curves():
    recs = [sample_answer(id=1), sample_answer(id=2, decision="no-go", curve=[])]
    rows = [
        {"quantity": "speedup (expected)", "values": [1.55, 0.93]},
        {"quantity": "k", "values": [2, None]},
    ]
    html = pages.comparison_page(recs, rows)
    assert_offline(html)
    assert 'href="/v1/recommendations/1/report"' in html and 'href="/v1/recommendations/2/report"' in html
    assert '<span class="pill go">GO</span>' in html and '<span class="pill no-go">NO-GO</span>' in html
    assert '<td>speedup (expected)</td><td class="num">1.55</td><td class="num">0.93</td>' in html
    assert svg_count(html) == 2


def test_calibration_page_measurements_fits_residuals_and_error():
    html = pages.calibration_page(
        sample_calibration_run(status="failed", error="CUDA out of memory <at start>")
    )
    assert_offline(html)
    assert "FAILED" in html and "CUDA out of memory &lt;at start&gt;" in html
    assert html.count('<tr><td class="num">') >= 12  # the measurements table, one row per probe point
    assert svg_count(html) == 3  # timing, acceptance (memory has no x axis), residuals
    assert "step_time_ms=6.00" in html


def test_calibration_series_use_explicit_fitted_values_or_residuals():
    run = sample_calibration_run()
    by_probe = {p.probe: p for p in probe_plots(run["measurements"], run["fits"])}
    timing = by_probe["timing"]
    assert (timing.x_key, timing.y_key) == ("batch_size", "step_time_ms")
    assert [s.label for s in timing.series] == ["query_tokens=1", "query_tokens=3"]
    assert timing.series[0].fitted == pytest.approx([6.05, 6.1, 6.2, 6.4])  # measured − residual
    acceptance = by_probe["acceptance"]
    assert acceptance.series[0].fitted == pytest.approx([2.55, 2.235, 2.1])  # values["fitted_<y>"]
    assert "memory" not in by_probe


def test_calibration_page_without_measurements():
    html = pages.calibration_page({"id": 9, "status": "queued"})
    assert "QUEUED" in html and "no measurements" in html and "no fits stored" in html


@pytest.mark.parametrize(
    "value,text",
    [
        (None, "—"),
        (True, "yes"),
        (1234, "1,234"),
        (1234.5, "1,234"),
        (1.234, "1.23"),
        (0.00123, "0.00123"),
        (float("nan"), "—"),
        ({"expected": 1.5, "low": 1.2, "high": 1.8}, "1.50 (1.20–1.80)"),
        ([0.6, 0.4], "[0.60, 0.40]"),
    ],
)
def test_fmt(value, text):
    assert fmt(value) == text


def test_speculative_config_is_copyable_json():
    import json

    config = {
        "method": "eagle",
        "num_speculative_tokens": 2,
        "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    }
    text = pages.compact_json(config)
    assert json.loads(text) == config and text.count("\n") == 4
