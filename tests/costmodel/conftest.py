"""Fixtures: the shipped catalogs as cost-model specs (no DB, no Flask)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor import costmodel as cm

DATA = Path(__file__).resolve().parents[2] / "advisor" / "data"


@pytest.fixture(scope="session")
def gpus() -> dict[str, cm.GpuSpec]:
    rows = json.loads((DATA / "gpus.json").read_text(encoding="utf-8"))["items"]
    return {r["name"]: cm.GpuSpec.from_dict(r) for r in rows}


@pytest.fixture(scope="session")
def models() -> dict[str, cm.ModelSpec]:
    rows = json.loads((DATA / "models.json").read_text(encoding="utf-8"))["items"]
    return {r["name"]: cm.ModelSpec.from_dict(r) for r in rows}


@pytest.fixture(scope="session")
def shipped_profiles() -> dict[str, cm.MeasuredEngineProfile]:
    """The shipped engine profiles (advisor/data/engine_profiles.json), by the GPU each was measured on."""
    rows = json.loads((DATA / "engine_profiles.json").read_text(encoding="utf-8"))["items"]
    return {r["gpu"]: cm.MeasuredEngineProfile.from_dict(r) for r in rows}


@pytest.fixture(scope="session")
def make_scenario():
    return scenario


def scenario(**overrides) -> cm.Scenario:
    """The issue's example scenario, with overrides (workload/speculator fields by name)."""
    workload = dict(prompt_tokens=512, output_tokens=256, temperature=0.0, structure="prose", concurrency=8,
                    requests_per_second=None)
    speculator = dict(method="eagle", draft_model="eagle-llama-3.1-8b", num_speculative_tokens=2)
    for key in list(overrides):
        if key in workload:
            workload[key] = overrides.pop(key)
        elif key in speculator:
            speculator[key] = overrides.pop(key)
    base = dict(gpu="H100-SXM", target_model="llama-3.1-8b-instruct", gpu_count=1, weights_dtype="bf16",
                acceptance=cm.AcceptanceInput(mean_acceptance_length=2.04), gpu_hour_usd=3.0)
    base.update(overrides)
    return cm.Scenario(speculator=cm.Speculator(**speculator), workload=cm.Workload(**workload), **base)
