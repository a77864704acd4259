"""The KV-cache dtype on the H200: vLLM's KV capacity and long-context decode steps with ``kv_cache_dtype`` auto
(bf16) and fp8, against the cost model (docs/gpu-closed-loop.md, "Run 12").

The measurement is the product's plan, target engine only, at an 8k-token context, once per KV-cache dtype
(``benchmarks/data/h200-vllm0.24-kv/``)::

    S="--only target --set context_len=8192 --set batch_sizes=[1,8,32] --set cycle_batch_sizes=[1,8,32]
       --set prompt_lengths=[8192] --set prefill_batch_sizes=[1]"
    python -m benchmarks.gpu_closed_loop calibrate --workdir /tmp/kv-auto $S --set 'kv_cache_dtype="auto"'
    python -m benchmarks.gpu_closed_loop calibrate --workdir /tmp/kv-fp8 $S --set 'kv_cache_dtype="fp8"'

``analyze`` (CPU) compares vLLM's KV-cache tokens with the cost model's bytes per token, and each decode step
with run 1's fit alone (the profile before run 12: its decode steps ran at a 128-token context, where the
bandwidth efficiency and the per-step overhead cannot be told apart) and with the shipped profile, which fits run
1's records together with these bf16 long-context steps (``gpu_closed_loop profile --extra-records``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import gpu_closed_loop as gcl

DATA = gcl.REPO_ROOT / "benchmarks" / "data" / "h200-vllm0.24-kv"
KV_DTYPES = ("auto", "fp8")


def records(kv_cache_dtype: str) -> list[dict]:
    return gcl.load_jsonl(DATA / f"kv-{kv_cache_dtype}.jsonl")


def long_context_steps(kv_cache_dtype: str) -> list[dict]:
    return [r for r in records(kv_cache_dtype) if r["probe"] == "step_time"]


def run1_fit():
    """Run 1's fit alone: the shipped profile until run 12."""
    run1 = gcl.calibration_records(gcl.REPO_ROOT / "benchmarks" / "data" / "h200-vllm0.24")
    gpu, model, draft = gcl.catalog_specs()
    return gcl.build_gpu_calibration(run1, gpu, model, draft)[0].step_time[model.name]


def analyze() -> dict:
    """vLLM's KV tokens against the memory model; each long-context step against run 1's fit (the profile before
    run 12) and the shipped profile (run 1 with run 12's bf16 steps), both with today's KV read cost
    (``steptime.KV_READ_COST_PER_BYTE``: an fp8 read priced at 1.44 bytes per byte, set from these fp8 steps)."""
    from advisor.costmodel.memory import kv_bytes_per_token
    from advisor.costmodel.steptime import forward_cost, step_time_from_cost

    gpu, model, _ = gcl.catalog_specs()
    shipped, before = gcl.shipped_profile().step_time, run1_fit()
    out: dict = {"kv_cache": {}, "steps": [], "profile": {"bandwidth_efficiency": shipped.bandwidth_efficiency,
                                                        "fixed_overhead_s": shipped.fixed_overhead_s},
                 "run1_fit": {"bandwidth_efficiency": before.bandwidth_efficiency,
                              "fixed_overhead_s": before.fixed_overhead_s}}
    for kv in KV_DTYPES:
        mem = next(r for r in records(kv) if r["probe"] == "memory")
        out["kv_cache"][kv] = {"vllm_tokens": mem["values"]["kv_cache_tokens"],
                               "engine_kv_cache_dtype": mem["params"]["engine"]["kv_cache_dtype"],
                               "bytes_per_token": kv_bytes_per_token(model, 1, kv)}
        cost = forward_cost(gpu, model, "bf16", 1, kv)
        for r in long_context_steps(kv):
            v = r["values"]
            b, ctx = v["batch_size"], v["context_len"] + 1 + v["steps"] / 2  # as calibration.fit.step_points reads it
            out["steps"].append({
                "kv_cache_dtype": kv, "batch_size": b, "context_len": v["context_len"], "measured_s": v["step_s"],
                "run1_fit_s": float(step_time_from_cost(cost, before, b, 1, ctx)),
                "shipped_profile_s": float(step_time_from_cost(cost, shipped, b, 1, ctx))})
    return out


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    result = analyze()
    for kv, c in result["kv_cache"].items():
        print(f"kv_cache_dtype={kv}: vLLM {c['vllm_tokens']:,} tokens, {c['bytes_per_token']:,} B per token")
    print("| KV dtype | B | context | measured | run 1's fit (the profile before run 12) | the shipped profile |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in result["steps"]:
        m = s["measured_s"]
        print(f"| {s['kv_cache_dtype']} | {s['batch_size']} | {s['context_len']} | {1e3 * m:.2f} ms | "
              f"{1e3 * s['run1_fit_s']:.2f} ms ({s['run1_fit_s'] / m - 1:+.0%}) | "
              f"{1e3 * s['shipped_profile_s']:.2f} ms ({s['shipped_profile_s'] / m - 1:+.0%}) |")
    for name in ("run1_fit", "profile"):
        r = result[name]
        print(f"{name}: bandwidth efficiency {r['bandwidth_efficiency']:.3f}, fixed overhead "
              f"{1e3 * r['fixed_overhead_s']:.2f} ms")
    if args.out_json:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(p)
    raise SystemExit(main(p.parse_args()))
