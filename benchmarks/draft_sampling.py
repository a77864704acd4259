"""How a model drafter samples its drafts changes what vLLM accepts at T > 0: greedy (vLLM's default) against
probabilistic drafting, measured through vLLM with the product's acceptance probe.

vLLM's ``draft_sample_method`` (``vllm/config/speculative.py``, 0.24 and later) defaults to ``"greedy"``: the drafter
proposes its argmax, and rejection sampling treats its distribution as one-hot, so a draft token x is accepted with the
target's probability p(x). ``"probabilistic"`` samples from the drafter's distribution q and accepts with min(1, p/q)
(Leviathan et al. 2023): Σ min(p, q) per position, which is 1 where q = p. At T = 0 both take the target's argmax.

Each method runs one engine (SmolLM2-135M-Instruct drafting for itself, ``draft_model``, k = 4, on the CPU build) and
:func:`calibration.probes.measure_acceptance` on our prompt sets at each temperature. Usage:
``python -m benchmarks.draft_sampling --out docs/data/draft-sampling.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

METHODS = ("greedy", "probabilistic")
TEMPERATURES = (0.0, 0.7, 1.0)
STRUCTURES = ("code", "prose")
K = 4


def measure(method: str, model: str, temperatures: tuple[float, ...], structures: tuple[str, ...],
            prompts_per_cell: int, max_tokens: int) -> list[dict[str, Any]]:
    """One engine whose drafter samples by ``method``; one acceptance measurement per (structure, temperature)."""
    from calibration.probes import (DrafterSpec, ProbeConfig, environment_info, load_prompts, measure_acceptance,
                                    start_engine, stop_engine)

    cfg = ProbeConfig(model=model, kv_cache_space_gib=1, max_model_len=2048, max_num_seqs=8, repeats=1,
                      max_tokens=max_tokens)
    drafter = DrafterSpec("draft_model", K, model="self", draft_sample_method=method, label=f"self-{method}")
    settings = cfg.engine_settings(model)
    spec = drafter.speculative_config(model)
    if method == "greedy":  # vLLM's default, as a command without the key runs
        spec.pop("draft_sample_method", None)
    llm, _ = start_engine(settings, spec)
    env, prompts = environment_info(), load_prompts(structures=structures)
    rows = []
    try:
        for structure in structures:
            for t in temperatures:
                m = measure_acceptance(llm, drafter, structure, t, prompts[structure][:prompts_per_cell], cfg,
                                       dict(settings, speculative_config=spec), env)
                row = {"draft_sample_method": method, "structure": structure, "temperature": t,
                       "acceptance_length": m.acceptance_length, "acceptance_rate": m.acceptance_rate,
                       "per_position_rate": m.per_position_rate, "num_drafts": m.num_drafts,
                       "output_tokens": m.output_tokens}
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        stop_engine(llm)
    return rows


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per (structure, temperature)")
    parser.add_argument("--max-tokens", type=int, default=128)


def main(args: argparse.Namespace) -> int:
    from calibration.models import prepare_smollm2

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    model = str(prepare_smollm2())
    rows = [r for method in METHODS
            for r in measure(method, model, TEMPERATURES, STRUCTURES, args.prompts, args.max_tokens)]
    result = {"model": "smollm2-135m-instruct (drafting for itself)", "method": "draft_model", "k": K,
              "prompts_per_cell": args.prompts, "max_tokens": args.max_tokens, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(f"{r['draft_sample_method']:>13} {r['structure']:>6} T={r['temperature']:<4g} "
              f"AL {r['acceptance_length']:.2f}  per position {[round(x, 2) for x in r['per_position_rate']]}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_cli_args(p)
    raise SystemExit(main(p.parse_args()))
