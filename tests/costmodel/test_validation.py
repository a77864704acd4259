"""The validation benchmark: every published case (the project's own data file), median |error| ≤ 10 % in- and
out-of-sample, every sign right, interval coverage ≥ 85 % (issues 3 and 9)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from benchmarks import validate

CASES = Path(os.environ.get("SPECADVISOR_VALIDATION_CASES", str(validate.DEFAULT_CASES)))


def test_cases_are_the_projects_own_data_with_sources():
    assert validate.DEFAULT_CASES.is_relative_to(validate.REPO_ROOT / "advisor" / "data")
    cases = json.loads(validate.DEFAULT_CASES.read_text(encoding="utf-8"))["cases"]
    assert cases and all(c.get("source") for c in cases)
    assert any(c.get("sets_default") for c in cases) and not all(c.get("sets_default") for c in cases)


def _args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    validate.add_cli_args(parser)
    return parser.parse_args(["--cases", str(CASES), "--timing-repeats", "1", *kw.get("extra", [])])


def test_every_row_expanded():
    cases = json.loads(CASES.read_text(encoding="utf-8"))["cases"]
    expected = sum(len(c.get("methods") or c.get("speedup") or []) for c in cases)
    gpus, models = validate.load_catalog(validate.DATA_DIR)
    rows = [r for c in cases for r in validate.predict_case(c, gpus, models)[0]]
    assert len(rows) == expected
    assert all(r.predicted > 0 for r in rows)


def test_benchmark_passes(capsys):
    assert validate.main(_args()) == 0
    out = capsys.readouterr().out
    assert "median |error|" in out and "PASS" in out
    assert "in-sample" in out and "out-of-sample" in out and "interval coverage" in out


def test_summary_figures_meet_the_targets(capsys):
    parser = argparse.ArgumentParser()
    validate.add_cli_args(parser)
    assert validate.main(parser.parse_args(["--cases", str(CASES), "--timing-repeats", "1", "--json"])) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["median_abs_error_in_sample"] <= 0.10 and summary["median_abs_error_out_of_sample"] <= 0.10
    assert summary["interval_coverage"] >= 0.85 and summary["wrong_signs"] == 0
    assert summary["rows_in_sample"] > 0 and summary["rows_out_of_sample"] > 0


def test_benchmark_can_fail(capsys):
    assert validate.main(_args(extra=["--max-median-error", "0.001"])) == 1
    assert "FAIL" in capsys.readouterr().out


def test_unreadable_cases_exit_2(tmp_path):
    parser = argparse.ArgumentParser()
    validate.add_cli_args(parser)
    assert validate.main(parser.parse_args(["--cases", str(tmp_path / "missing.json")])) == 2


def test_closed_loop_run_is_re_predicted_with_its_coverage(capsys):
    assert validate.closed_loop_coverage(validate.CLOSED_LOOP_RUN) == 0
    out = capsys.readouterr().out
    assert "interval coverage" in out and out.count("measured") == 9
