"""The cost model of speculative decoding: pure, typed functions (no Flask, no DB, no I/O).

Public API (stable): predict, step_time_s, check_draft, the dataclasses in types, CostModelError,
COST_MODEL_VERSION, STRUCTURES, METHODS, WEIGHTS_DTYPES.
"""
from __future__ import annotations

from .acceptance import (al_from_per_position, alpha_from_al, expected_tokens_iid, per_position_rates,
                         walltime_improvement_iid)
from .checks import HEAD_KINDS, check_draft, check_tensor_parallel
from .decision import GO_THRESHOLD, decide
from .memory import kv_bytes_per_token, memory_report, weights_bytes
from .predict import (CURVE_CONCURRENCY, Prediction, calibrated_acceptance, calibration_mismatch,
                      compared_heads, conditions_mismatch, dynamic_table, finite_json, matching_profile, predict,
                      profile_summary, speedup_point, step_params, timing_run)
from .priors import prior_acceptance
from .steptime import default_prefill_params, default_step_time_params, step_time_s
from .types import (COST_MODEL_VERSION, ENGINES, KV_CACHE_DTYPES, METHODS, MODEL_KINDS, STRUCTURES, WEIGHTS_DTYPES,
                    AcceptanceInput, AcceptanceModel, Calibration, CostModelError, GpuSpec, Issue, MeasuredEngineProfile,
                    ModelSpec,
                    PrefillParams, Scenario, Slo, Speculator, StepTimeParams, TcoLoad, Workload, acceptance_key)

__all__ = [
    "AcceptanceInput", "AcceptanceModel", "COST_MODEL_VERSION", "CURVE_CONCURRENCY", "Calibration",
    "calibrated_acceptance", "calibration_mismatch", "compared_heads", "conditions_mismatch", "HEAD_KINDS",
    "CostModelError", "ENGINES", "MeasuredEngineProfile", "matching_profile", "profile_summary", "GO_THRESHOLD", "GpuSpec", "Issue", "METHODS", "MODEL_KINDS", "ModelSpec",
    "Prediction", "PrefillParams", "STRUCTURES", "Scenario", "Slo", "Speculator", "StepTimeParams", "TcoLoad",
    "KV_CACHE_DTYPES", "WEIGHTS_DTYPES", "Workload", "acceptance_key", "al_from_per_position", "alpha_from_al", "check_draft",
    "check_tensor_parallel",
    "decide", "default_prefill_params", "default_step_time_params", "dynamic_table", "expected_tokens_iid",
    "finite_json",
    "kv_bytes_per_token", "memory_report", "per_position_rates", "predict", "prior_acceptance", "speedup_point",
    "step_params", "step_time_s", "timing_run",
    "walltime_improvement_iid", "weights_bytes",
]
