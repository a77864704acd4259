"""The validation benchmark: every published case, median |error| ≤ 10 %, every sign right (issue 3)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from benchmarks import validate

CASES = Path(os.environ.get("SPECADVISOR_VALIDATION_CASES", str(validate.DEFAULT_CASES)))
pytestmark = pytest.mark.skipif(not CASES.exists(), reason=f"no validation cases at {CASES}")


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


def test_benchmark_can_fail(capsys):
    assert validate.main(_args(extra=["--max-median-error", "0.001"])) == 1
    assert "FAIL" in capsys.readouterr().out


def test_unreadable_cases_exit_2(tmp_path):
    parser = argparse.ArgumentParser()
    validate.add_cli_args(parser)
    assert validate.main(parser.parse_args(["--cases", str(tmp_path / "missing.json")])) == 2
