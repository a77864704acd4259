"""A hand-made stored recommendation (``services.recommendations.as_dict`` shape) for renderer tests."""

from __future__ import annotations

import copy
from typing import Any

from tests.conftest import example_scenario

_CURVE = [
    {
        "concurrency": c,
        "speedup": s,
        "low": s - 0.15,
        "high": s + 0.12,
        "best_k": k,
        "tpot_ms_baseline": b,
        "tpot_ms_speculative": b / s,
    }
    for c, s, k, b in (
        (1, 1.82, 3, 6.1),
        (2, 1.78, 3, 6.2),
        (4, 1.7, 3, 6.4),
        (8, 1.55, 2, 6.9),
        (16, 1.31, 2, 7.8),
        (32, 1.08, 1, 9.6),
        (64, 0.91, 0, 13.4),
        (128, 0.8, 0, 21.0),
    )
]

SAMPLE: dict[str, Any] = {
    "id": 7,
    "created_at": "2025-06-01T12:00:00+00:00",
    "workload_id": 3,
    "scenario": example_scenario(),
    "decision": "go",
    "reasons": ["speedup 1.55× (1.40–1.67) at concurrency 8 clears 1.1", "prefill is 12 % of latency"],
    "speedup": {"expected": 1.55, "low": 1.40, "high": 1.67},
    "num_speculative_tokens": 2,
    "tpot_ms": {"baseline": 6.9, "speculative": 4.45},
    "ttft_ms": {"baseline": 38.0, "speculative": 41.0},
    "latency_ms": {
        "baseline": {"prefill": 38.0, "decode": 1766.4, "total": 1804.4},
        "speculative": {"prefill": 41.0, "decode": 1139.2, "total": 1180.2},
        "prefill_share": 0.035,
    },
    "throughput_tok_s": {"baseline": 1159.4, "speculative": 1797.8},
    "acceptance": {
        "mean_acceptance_length": 2.04,
        "per_position": [0.62, 0.42],
        "acceptance_rate": 0.52,
        "source": "input",
    },
    "memory": {
        "usable_gb": 73.6,
        "target_weights_gb": 16.06,
        "draft_weights_gb": 1.55,
        "kv_bytes_per_token_target": 131072,
        "kv_bytes_per_token_draft": 4096,
        "activation_reserve_gb": 1.9,
        "kv_space_gb": 54.09,
        "headroom_gb": 53.26,
        "context_tokens": 768,
        "max_concurrency_baseline": 552,
        "max_concurrency_speculative": 519,
        "fits": True,
    },
    "curve": copy.deepcopy(_CURVE),
    "break_even_concurrency": 40.5,
    "dynamic_sd": [[1, 4, 3], [5, 24, 2], [25, 40, 1], [41, 1024, 0]],
    "methods": [
        {"method": "eagle", "drafter": "eagle-llama-3.1-8b", "speedup": 1.55, "mean_acceptance_length": 2.04},
        {"method": "ngram", "drafter": None, "speedup": 1.12, "mean_acceptance_length": 1.4},
    ],
    "tco": {
        "gpu_hour_usd": 3.0,
        "usd_per_million_output_tokens": {"baseline": 0.72, "speculative": 0.46},
        "gpus_needed": {"baseline": 4, "speculative": 3},
        "monthly_usd": {"baseline": 8760.0, "speculative": 6570.0},
        "monthly_savings_usd": 2190.0,
    },
    "vllm": {
        "speculative_config": {
            "method": "eagle",
            "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
            "num_speculative_tokens": 2,
        },
        "serve_flags": "vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config "
        '\'{"method": "eagle", "num_speculative_tokens": 2}\'',
    },
    "checks": [
        {"severity": "warning", "field": "workload.temperature", "message": "<b>not bold</b> escaped"}
    ],
    "provenance": {
        "speedup.expected": "prior:eagle/prose",
        "acceptance.mean_acceptance_length": "input",
        "memory.target_weights_gb": "catalog:llama-3.1-8b-instruct",
        "tco.gpu_hour_usd": "input",
        "tpot_ms.baseline": "calibration:3",
        "gpu.memory_gb": "catalog:H100-SXM",
        "curve[0].speedup": "prior:eagle/prose",
        "curve": "default",
    },
    "cost_model_version": "1.0.0",
    "calibration_run_id": 3,
}


def sample_answer(**changes: Any) -> dict[str, Any]:
    answer = copy.deepcopy(SAMPLE)
    answer.update(changes)
    return answer


def sample_calibration_update() -> dict[str, Any]:
    """Measurements and fits as a probe job would record them (residual = measured − fitted, in order)."""
    timing = [
        (
            {"model": "llama-3.1-8b-instruct", "batch_size": b, "query_tokens": q},
            {"step_time_ms": 6.0 + 0.05 * b * q + (0.1 if b == 4 else -0.05)},
        )
        for q in (1, 3)
        for b in (1, 2, 4, 8)
    ]
    fitted = [6.0 + 0.05 * p["batch_size"] * p["query_tokens"] for p, _ in timing]
    residuals = [v["step_time_ms"] - f for (_, v), f in zip(timing, fitted)]
    acceptance = [
        (
            {"structure": "code", "temperature": t},
            {"mean_acceptance_length": 2.6 - 0.5 * t, "fitted_mean_acceptance_length": 2.55 - 0.45 * t},
        )
        for t in (0.0, 0.7, 1.0)
    ]
    return {
        "status": "succeeded",
        "message": "3 probes done",
        "environment": {"gpu": "H100-SXM", "vllm": "0.33.0"},
        "measurements": [{"probe": "timing", "params": p, "values": v} for p, v in timing]
        + [{"probe": "acceptance", "params": p, "values": v} for p, v in acceptance]
        + [
            {
                "probe": "memory",
                "params": {"drafter": True},
                "values": {"num_gpu_blocks": 4000, "block_size": 16},
            }
        ],
        "fits": [
            {
                "kind": "step_time",
                "key": "llama-3.1-8b-instruct",
                "params": {
                    "bandwidth_efficiency": 0.8,
                    "compute_efficiency": 0.6,
                    "fixed_overhead_s": 0.0012,
                },
                "residuals": residuals,
            },
            {
                "kind": "acceptance",
                "key": "eagle|eagle-llama-3.1-8b|code",
                "params": {"logit_intercept": 1.2},
                "residuals": [0.05, -0.02, 0.01],
            },
        ],
    }


def sample_calibration_run(**changes: Any) -> dict[str, Any]:
    """A CalibrationRunSchema-shaped dict."""
    update = sample_calibration_update()
    run = {
        "id": 3,
        "hardware": "H100-SXM",
        "target_model": "llama-3.1-8b-instruct",
        "method": "eagle",
        "draft_model": "eagle-llama-3.1-8b",
        "status": update["status"],
        "progress": 1.0,
        "message": update["message"],
        "error": None,
        "queue": "calibration-h100-sxm",
        "job_id": "abc",
        "config": {"batch_sizes": [1, 2, 4, 8], "temperatures": [0.0, 0.7, 1.0]},
        "environment": update["environment"],
        "created_at": "2025-06-01T10:00:00+00:00",
        "started_at": "2025-06-01T10:00:05+00:00",
        "finished_at": "2025-06-01T10:06:00+00:00",
        "measurements": update["measurements"],
        "fits": update["fits"],
    }
    run.update(changes)
    return run
