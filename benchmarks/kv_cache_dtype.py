"""The KV-cache dtype on a GPU: vLLM's KV capacity and long-context decode steps with ``kv_cache_dtype`` auto
(bf16) and fp8, against the cost model (docs/gpu-closed-loop.md, "Run 12" on the H200, "Run 20" on the H100).

The measurement is the product's plan, target engine only, at an 8k-token context, once per KV-cache dtype
(``benchmarks/data/h200-vllm0.24-kv/``, ``h100-vllm0.24-kv/``; on the lent GPU ``scripts/gpu-closed-loop.sh kv-auto
kv-fp8`` runs these)::

    S="--only target --set context_len=8192 --set batch_sizes=[1,8,32] --set cycle_batch_sizes=[1,8,32]
       --set prompt_lengths=[8192] --set prefill_batch_sizes=[1]"
    python -m benchmarks.gpu_closed_loop calibrate --workdir /tmp/kv-auto $S --set 'kv_cache_dtype="auto"'
    python -m benchmarks.gpu_closed_loop calibrate --workdir /tmp/kv-fp8 $S --set 'kv_cache_dtype="fp8"'

``analyze`` (CPU) compares vLLM's KV-cache tokens with the cost model's bytes per token, and each decode step
with the fit of the lease's calibrations alone (``BEFORE``; on the H200 run 1's, the profile before run 12: its
decode steps ran at a 128-token context, where the bandwidth efficiency and the per-step overhead cannot be told
apart) and with the profile the product prices that GPU by, whose calibrations take these bf16 long-context steps
too (``gpu_closed_loop profile --extra-records``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import gpu_closed_loop as gcl

DATA_ROOT = gcl.REPO_ROOT / "benchmarks" / "data"
DATA = DATA_ROOT / "h200-vllm0.24-kv"
BEFORE = {"h200-vllm0.24-kv": ("h200-vllm0.24",),  # run 1: the shipped profile until run 12
          "h100-vllm0.24-kv": ("h100-vllm0.24", "h100-vllm0.24-second", "h100-vllm0.24-run20")}
KV_DTYPES = ("auto", "fp8")


def records(kv_cache_dtype: str, data: Path = DATA) -> list[dict]:
    return gcl.load_jsonl(data / f"kv-{kv_cache_dtype}.jsonl")


def long_context_steps(kv_cache_dtype: str, data: Path = DATA) -> list[dict]:
    return [r for r in records(kv_cache_dtype, data) if r["probe"] == "step_time"]


def data_gpu(data: Path) -> str:
    """The catalog GPU the long steps ran on (their run's detected GPU)."""
    return gcl.catalog_gpu(json.loads((data / "kv-auto-run.json").read_text())["environment"].get("gpu_name"))


def calibration_fit(runs: tuple[str, ...], gpu_name: str):
    """The target's step-time fit of these calibrations pooled, without long-context steps of their own beyond the
    plan's (what the lease's calibrations say alone)."""
    gpu, model, draft = gcl.catalog_specs(gcl.DRAFT, gpu_name)
    records = gcl.pooled_records([DATA_ROOT / r for r in runs])
    return gcl.build_gpu_calibration(records, gpu, model, draft)[0].step_time[model.name]


def analyze(data: Path = DATA) -> dict:
    """vLLM's KV tokens against the memory model; each long-context step against the fit of the lease's
    calibrations alone (``BEFORE``) and the profile the product prices the GPU by (on the H200 run 1 with run 12's
    bf16 steps, since run 13 five calibrations with them), both with today's KV read cost
    (``steptime.kv_read_cost_per_byte``: an fp8 read priced per GPU measured, 1.44 bytes per byte on the H200 and
    1.16 on the H100, from these fp8 steps)."""
    from advisor.costmodel.memory import kv_bytes_per_token
    from advisor.costmodel.steptime import forward_cost, step_time_from_cost

    gpu_name = data_gpu(data)
    gpu, model, _ = gcl.catalog_specs(gcl.DRAFT, gpu_name)
    shipped, before = gcl.shipped_profile(gpu=gpu_name).step_time, calibration_fit(BEFORE[data.name], gpu_name)
    out: dict = {"gpu": gpu_name, "before_runs": list(BEFORE[data.name]), "kv_cache": {}, "steps": [],
                 "profile": {"bandwidth_efficiency": shipped.bandwidth_efficiency,
                             "fixed_overhead_s": shipped.fixed_overhead_s},
                 "before_fit": {"bandwidth_efficiency": before.bandwidth_efficiency,
                                "fixed_overhead_s": before.fixed_overhead_s}}
    for kv in KV_DTYPES:
        mem = next(r for r in records(kv, data) if r["probe"] == "memory")
        out["kv_cache"][kv] = {"vllm_tokens": mem["values"]["kv_cache_tokens"],
                               "engine_kv_cache_dtype": mem["params"]["engine"]["kv_cache_dtype"],
                               "bytes_per_token": kv_bytes_per_token(model, 1, kv)}
        cost = forward_cost(gpu, model, "bf16", 1, kv)
        for r in long_context_steps(kv, data):
            v = r["values"]
            b, ctx = v["batch_size"], v["context_len"] + 1 + v["steps"] / 2  # as calibration.fit.step_points reads it
            out["steps"].append({
                "kv_cache_dtype": kv, "batch_size": b, "context_len": v["context_len"], "measured_s": v["step_s"],
                "before_fit_s": float(step_time_from_cost(cost, before, b, 1, ctx)),
                "shipped_profile_s": float(step_time_from_cost(cost, shipped, b, 1, ctx))})
    return out


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=DATA.name, choices=sorted(BEFORE),
                        help="the long-step runs (kv-auto.jsonl, kv-fp8.jsonl) of one lease, in benchmarks/data")
    parser.add_argument("--out-json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    result = analyze(DATA_ROOT / args.data)
    for kv, c in result["kv_cache"].items():
        print(f"kv_cache_dtype={kv}: vLLM {c['vllm_tokens']:,} tokens, {c['bytes_per_token']:,} B per token")
    print(f"| KV dtype | B | context | measured | the fit of {', '.join(result['before_runs'])} | the profile |")
    print("|---|---:|---:|---:|---:|---:|")
    for s in result["steps"]:
        m = s["measured_s"]
        print(f"| {s['kv_cache_dtype']} | {s['batch_size']} | {s['context_len']} | {1e3 * m:.2f} ms | "
              f"{1e3 * s['before_fit_s']:.2f} ms ({s['before_fit_s'] / m - 1:+.0%}) | "
              f"{1e3 * s['shipped_profile_s']:.2f} ms ({s['shipped_profile_s'] / m - 1:+.0%}) |")
    for name in ("before_fit", "profile"):
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
