"""A copy drafter's share of drafting steps along the output (issue 8): does the probe plan's output checkpoint
predict how much a longer or a shorter output drafts?

``measure`` runs the product's acceptance probe (``calibration.probes.measure_acceptance``) on one n-gram engine
(SmolLM2-135M-Instruct on vLLM's CPU build by default), each structure's probe prompts at T = 0 generated to each of
``--budgets`` output tokens (the same prompts and seed, so a shorter budget is the longer generation stopped early),
one JSON row per cell. ``analyze`` fits each structure as the plan does (``calibration.fit.fit_acceptance`` on the
cell at ``--full`` tokens with its checkpoint at half of it) and compares the fitted share over each budget's mean
output (``advisor.costmodel.acceptance.draft_fraction_at``, what answers read) with the measured one; the budgets
below the checkpoint and above the full cell are out of sample. ``closed-loop`` reads a closed loop's calibration
(``benchmarks/closed_loop.py``, the plan with its checkpoints) and its measurements at several output limits
(``--output-tokens``: ``measurements-<N>.jsonl``) and predicts each twice through the closed loop's own ``compare``:
as calibrated, and with the checkpoints left out (one share for every length).

    python -m benchmarks.drafting_along_output measure --out rows.jsonl      # ~25 min on 2 AVX2 cores
    python -m benchmarks.drafting_along_output analyze --rows benchmarks/data/drafting-along-output-smollm2-cpu.jsonl
    python -m benchmarks.drafting_along_output closed-loop --run benchmarks/data/h100-vllm0.24-smollm2-output-length \
        --gpu H100-SXM
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

STRUCTURES = ("code", "json", "sql", "prose", "creative", "rag")
K = 4
PROMPTS = 12


def measure(args: argparse.Namespace) -> None:
    import dataclasses

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from calibration.models import prepare_smollm2
    from calibration.probes import DrafterSpec, ProbeConfig, load_prompts, measure_acceptance, start_engine, stop_engine

    model = args.model or str(prepare_smollm2())
    cfg = ProbeConfig(model=model, kv_cache_space_gib=1, max_model_len=2048, max_num_seqs=16, repeats=1)
    drafter = DrafterSpec("ngram", K)
    llm, _ = start_engine(cfg.engine_settings(model), drafter.speculative_config(model))
    prompts = load_prompts(None)
    try:
        with open(args.out, "a") as out:
            for structure in args.structures.split(","):
                for budget in sorted(int(b) for b in args.budgets.split(",")):
                    m = measure_acceptance(llm, drafter, structure, 0.0, prompts[structure][:PROMPTS],
                                           dataclasses.replace(cfg, max_tokens=budget), {}, {})
                    row = {"structure": structure, "T": 0.0, "max_tokens": budget, "out": m.output_tokens,
                           "steps": m.decode_steps, "drafts": m.num_drafts, "acc": m.num_accepted_tokens,
                           "wall": m.wall_s, "num_prompts": m.num_prompts, "k": K}
                    print(json.dumps(row), file=out, flush=True)
                    print(json.dumps(row), flush=True)
    finally:
        stop_engine(llm)


def _record(row: dict, probe: str) -> dict:
    """A cell's row as the acceptance record the fit reads (its per-position counts are not used here)."""
    accepted = row["acc"]
    return {"probe": probe, "params": {"engine": {}}, "values": {
        "label": f"ngram-k{row.get('k', K)}", "method": "ngram", "drafter": None, "k": row.get("k", K),
        "structure": row["structure"], "temperature": row["T"], "num_prompts": row.get("num_prompts", PROMPTS),
        "output_tokens": row["out"], "num_drafts": row["drafts"], "num_draft_tokens": row["drafts"] * K,
        "num_accepted_tokens": accepted, "accepted_per_pos": [accepted] + [0] * (K - 1),
        "decode_steps": row["steps"], "max_tokens": row["max_tokens"]}}


def analyze(rows: list[dict], full: int) -> dict:
    """Per structure: the measured share of drafting steps at each budget, and the share read from the plan's fit
    (the cell at ``full`` tokens and its checkpoint at ``full // 2``) and from the fit without the checkpoint."""
    from advisor.costmodel.acceptance import draft_fraction_at
    from calibration.fit import fit_acceptance

    result: dict = {"full": full, "checkpoint": full // 2, "structures": {}}
    errors: dict[str, list[float]] = {"with_checkpoint": [], "without": []}
    for structure in sorted({r["structure"] for r in rows}, key=STRUCTURES.index):
        cells = {r["max_tokens"]: r for r in rows if r["structure"] == structure}
        if full not in cells or full // 2 not in cells:
            continue
        main = _record(cells[full], "acceptance")
        grown = fit_acceptance([main, _record(cells[full // 2], "acceptance_checkpoint")], "ngram", None,
                               structure).params
        flat = fit_acceptance([main], "ngram", None, structure).params
        points = []
        for budget, r in sorted(cells.items()):
            tokens = r["out"] / r.get("num_prompts", PROMPTS)
            measured = r["drafts"] / r["steps"]
            point = {"budget": budget, "tokens_per_prompt": round(tokens, 1), "measured": round(measured, 4),
                     "with_checkpoint": round(draft_fraction_at(grown, 0.0, tokens), 4),
                     "without": round(draft_fraction_at(flat, 0.0, tokens), 4),
                     "in_sample": budget in (full, full // 2)}
            points.append(point)
            if not point["in_sample"]:
                for name in errors:
                    errors[name].append(point[name] / measured - 1.0)
        result["structures"][structure] = {"output_slope": round(grown.draft_fraction_output_slope, 3),
                                           "points": points}
    result["out_of_sample_median_abs_error"] = {
        name: round(statistics.median(abs(e) for e in errs), 4) if errs else None for name, errs in errors.items()}
    return result


def closed_loop(run: Path, gpu_name: str | None = None) -> dict:
    """Per output limit (``measurements-<N>.jsonl`` beside ``calibration-records.jsonl`` in ``run``): each held-out
    workload's measured speedup and share of drafting steps, predicted from the calibration as it is (``grown``)
    and without its checkpoints (``flat``), and per limit the median |error| of both (the n-gram workloads)."""
    import dataclasses

    from benchmarks import closed_loop as cl
    from benchmarks.gpu_closed_loop import load_jsonl

    records = load_jsonl(run / "calibration-records.jsonl")
    fits = {"grown": records, "flat": [r for r in records if r["probe"] != "acceptance_checkpoint"]}
    gpu = {"gpu_name": gpu_name} if gpu_name else {}
    result: dict = {}
    for path in sorted(run.glob("measurements-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        limit = int(path.stem.split("-")[1])
        measured = cl.pool_measurements(load_jsonl(path))
        cases = [dataclasses.replace(c, output_tokens=limit) for c in cl.workloads()]
        by = {name: [r for r in cl.compare(cases, measured, recs, **gpu)[0] if r.method == "ngram"]
              for name, recs in fits.items()}
        rows = [{"workload": g.name, "output_tokens": g.output_tokens,
                 "measured_speedup": round(g.measured_speedup, 4),
                 "measured_draft_fraction": round(g.measured_draft_fraction, 4), "decision": g.decision,
                 **{name: {"speedup": round(r.predicted_speedup, 4),
                           "draft_fraction": round(r.predicted_draft_fraction, 4)} for name, r in (("grown", g),
                                                                                                   ("flat", f))}}
                for g, f in zip(by["grown"], by["flat"])]
        result[limit] = {"workloads": rows, **{name: {
            "median_abs_speedup_error": round(statistics.median(abs(r.error) for r in rs), 4),
            "median_abs_draft_fraction_error": round(statistics.median(
                abs(r.predicted_draft_fraction - r.measured_draft_fraction) for r in rs), 4),
            "signs": sum((r.predicted_speedup > 1) == (r.measured_speedup > 1) for r in rs),
            "covered": sum(r.predicted_low <= r.measured_speedup <= r.predicted_high for r in rs)}
            for name, rs in by.items()}}
    return result


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="phase", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    m.add_argument("--model", default=None, help="default: the cached SmolLM2-135M-Instruct")
    m.add_argument("--structures", default=",".join(STRUCTURES))
    m.add_argument("--budgets", default="32,64,128,256", help="output tokens per generation")
    a = sub.add_parser("analyze")
    a.add_argument("--rows", type=Path, required=True)
    a.add_argument("--full", type=int, default=128, help="the plan's generation (its checkpoint: half of it)")
    a.add_argument("--out-json", type=Path)
    c = sub.add_parser("closed-loop")
    c.add_argument("--run", type=Path, required=True,
                   help="calibration-records.jsonl and measurements-<output limit>.jsonl of one closed loop")
    c.add_argument("--gpu", default=None, help="the run's GPU (catalog name); default: the CPU build")


def main(args: argparse.Namespace) -> None:
    if args.phase == "measure":
        measure(args)
        return
    if args.phase == "closed-loop":
        for limit, data in closed_loop(args.run, args.gpu).items():
            for w in data["workloads"]:
                g, f = w["grown"], w["flat"]
                print(f"{limit:>4} {w['workload']:12} {w['output_tokens']:>4} tok | "
                      f"speedup {w['measured_speedup']:.2f} (fit {g['speedup']:.2f}, flat {f['speedup']:.2f}) | "
                      f"share {w['measured_draft_fraction']:.2f} "
                      f"(fit {g['draft_fraction']:.2f}, flat {f['draft_fraction']:.2f}) | {w['decision']}")
            print(f"{limit:>4} " + "; ".join(
                f"{name}: |speedup error| {d['median_abs_speedup_error']:.1%}, |share error| "
                f"{d['median_abs_draft_fraction_error']:.3f}, signs {d['signs']}, intervals {d['covered']} of "
                f"{len(data['workloads'])}" for name, d in data.items() if name != "workloads"))
        return
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    result = analyze(rows, args.full)
    for structure, data in result["structures"].items():
        cells = ", ".join(f"{p['tokens_per_prompt']:.0f} tok {p['measured']:.1%} (fit {p['with_checkpoint']:.1%}, "
                          f"flat {p['without']:.1%}{'' if p['in_sample'] else ', out'})" for p in data["points"])
        print(f"{structure:9} slope {data['output_slope']:+.2f}: {cells}")
    print("out of sample, median |error| of the share:", result["out_of_sample_median_abs_error"])
    if args.out_json:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    main(parser.parse_args())
