"""Answer identity across a refactor: the exact answer texts of many varied scenarios, to compare two trees.

A speed change must not change any answer. This writes, for a seeded spread of scenarios (every GPU, target,
method and drafter; stated, per-position or prior acceptance; closed and open loop; TP, dtypes, engines, SLOs,
loads, a calibration run, measured engine profiles, infeasible deployments and rejected inputs), one line per
scenario: the cost model's answer text (``Prediction.json_text``) or its error, and for the API's request
bodies the scenario as the schema loads it (the stored ``inputs`` text) or the 422 fields. Run it with each
tree on ``PYTHONPATH`` and compare the files byte for byte::

    PYTHONPATH=/path/to/main python -m benchmarks.answer_identity --out main.txt
    PYTHONPATH=$PWD python -m benchmarks.answer_identity --out branch.txt
    cmp main.txt branch.txt
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "advisor" / "data"
HEAD_KIND = {"eagle": "eagle_head", "eagle3": "eagle3_head", "mtp": "mtp_head"}
CALIBRATION = {  # as tests/costmodel/test_golden.py
    "run_id": 7, "hardware": "H100-SXM",
    "step_time": {"llama-3.1-8b-instruct": {"bandwidth_efficiency": 0.75, "compute_efficiency": 0.45,
                                            "fixed_overhead_s": 8e-4, "timing_rms_rel": 0.05,
                                            "covariance": [[1e-4, 0, 0], [0, 1e-4, 0], [0, 0, 1e-8]]}},
    "prefill": {}, "acceptance": {}, "max_batch_calibrated": 16, "temperature_range": [0.0, 1.0]}


def body(rng: random.Random, gpus: dict, models: dict) -> dict[str, Any]:
    """A random API request body (mostly valid; every tenth one is perturbed to be rejected)."""
    targets = sorted(n for n, m in models.items() if m["kind"] == "causal_lm")
    target = rng.choice(targets)
    t = models[target]

    def drafters(method: str) -> list[str]:
        if method == "draft_model":
            return [n for n, m in models.items() if m["kind"] == "causal_lm" and n != target
                    and m["tokenizer_family"] == t["tokenizer_family"] and m["param_count"] < t["param_count"]]
        return [n for n, m in models.items() if m["kind"] == HEAD_KIND[method] and m["hidden_size"] == t["hidden_size"]]

    methods = ["ngram", "suffix"] + [m for m in ("draft_model", "eagle", "eagle3", "mtp") if drafters(m)]
    method = rng.choice(methods)
    k = rng.choice([None, None, 1, 2, 3, 4, 5, 8, 16])
    speculator = {"method": method, "num_speculative_tokens": k}
    if method not in ("ngram", "suffix"):
        speculator["draft_model"] = rng.choice(drafters(method))
    workload: dict[str, Any] = {"prompt_tokens": rng.choice([1, 17, 128, 512, 1500, 4096, 32_000]),
                                "output_tokens": rng.choice([1, 2, 64, 256, 1024, 4000]),
                                "temperature": rng.choice([0.0, 0.0, 0.3, 0.7, 1.0, 1.5, 2.0]),
                                "structure": rng.choice(["code", "json", "sql", "prose", "creative", "rag"])}
    if rng.random() < 0.7:
        workload["concurrency"] = rng.choice([1, 2, 7, 8, 32, 100, 256, 1024, 4096])
    else:
        workload["requests_per_second"] = rng.choice([0.05, 0.5, 3.0, 40.0, 500.0])
    out: dict[str, Any] = {"gpu": rng.choice(sorted(gpus)), "target_model": target, "speculator": speculator,
                           "workload": workload, "gpu_count": rng.choice([1, 1, 1, 2, 4, 8]),
                           "weights_dtype": rng.choice(["bf16", "bf16", "fp16", "fp8", "int8", "int4"])}
    form = rng.random()
    if form < 0.25:
        out["acceptance"] = {"acceptance_rate": round(rng.random(), 3)}
    elif form < 0.4:
        out["acceptance"] = {"mean_acceptance_length": round(1 + rng.random() * (k or 3), 3)}
    elif form < 0.55:
        out["acceptance"] = {"per_position": sorted((round(rng.random(), 2) for _ in range(rng.randint(1, 8))),
                                                    reverse=True)}
    if "acceptance" in out and rng.random() < 0.2:
        out["acceptance"]["draft_fraction"] = rng.choice([0.3, 0.9, 1.0])
    for key, values in (("gpu_hour_usd", [0.5, 1.5, 3.0]), ("vram_gb", [16.0, 80.0, 500.0]),
                        ("gpu_memory_utilization", [0.5, 0.9, 1.0]), ("hours_per_month", [100.0, 744.0]),
                        ("vllm_version", ["0.24", "0.24.1", "0.12", "0.8.5"])):
        if rng.random() < 0.25:
            out[key] = rng.choice(values)
    if rng.random() < 0.25:
        out["slo"] = {rng.choice(["tpot_ms", "ttft_ms", "latency_ms"]): rng.choice([5.0, 30.0, 500.0, 20_000.0])}
    if rng.random() < 0.2:
        out["load"] = rng.choice([{"requests_per_second": 20.0}, {"output_tokens_per_second": 50_000.0}])
    if rng.random() < 0.1:  # rejected by the schema
        bad = rng.choice([("gpu_count", 0), ("weights_dtype", "fp4"), ("extra", 1), ("workload", {}),
                          ("acceptance", {"per_position": [0.2, 0.9]}), ("speculator", {"method": "eagle"})])
        out[bad[0]] = bad[1]
    return out


def main(args: argparse.Namespace) -> None:
    from advisor import costmodel as cm
    from advisor.schemas import ScenarioSchema
    from advisor.services.recommendations import scenario_from_dict

    gpus = {r["name"]: r for r in json.loads((DATA / "gpus.json").read_text())["items"]}
    models = {r["name"]: r for r in json.loads((DATA / "models.json").read_text())["items"]}
    profiles = tuple(cm.MeasuredEngineProfile.from_dict(p)
                     for p in json.loads((DATA / "engine_profiles.json").read_text())["items"])
    gpu_specs = {n: cm.GpuSpec.from_dict(r) for n, r in gpus.items()}
    model_specs = {n: cm.ModelSpec.from_dict(r) for n, r in models.items()}
    measured_gpus = {p.gpu: gpu_specs[p.gpu] for p in profiles}  # as services.catalog.engine_profile_for
    calibration = cm.Calibration.from_dict(CALIBRATION)
    schema = ScenarioSchema()
    rng = random.Random(args.seed)
    lines = []
    for i in range(args.count):
        raw = body(rng, gpus, models)
        try:
            data = schema.load(json.loads(json.dumps(raw)))
        except Exception as exc:  # noqa: BLE001  (the 422's fields are part of what must not change)
            lines.append(f"{i} rejected {json.dumps(getattr(exc, 'messages', str(exc)), sort_keys=True)}")
            continue
        lines.append(f"{i} inputs {json.dumps(data, sort_keys=True, default=str)}")
        scenario = scenario_from_dict(data)
        if rng.random() < 0.1:
            scenario = cm.Scenario(**{**scenario.__dict__, "engine": rng.choice(["sglang", "hf"])})
        cal = calibration if scenario.target_model == "llama-3.1-8b-instruct" and rng.random() < 0.5 else None
        draft = model_specs[scenario.speculator.draft_model] if scenario.speculator.draft_model else None
        gpu = gpu_specs[scenario.gpu]
        try:
            target = model_specs[scenario.target_model]
            answer = cm.predict(scenario, gpu, target, draft, calibration=cal, catalog_sources={"x": "y"},
                                profile=cm.matching_profile(profiles, gpu, scenario.vllm_version, measured_gpus),
                                heads=cm.compared_heads(target, model_specs.values())).json_text
        except cm.CostModelError as exc:
            answer = f"error {exc.field}: {exc.message}"
        lines.append(f"{i} answer {answer}")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{args.count} scenarios, {sum(' answer {' in line for line in lines)} answers, "
          f"{sum(' rejected ' in line for line in lines)} rejected, "
          f"{sum(' answer error' in line for line in lines)} cost-model errors -> {args.out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    main(parser.parse_args())
