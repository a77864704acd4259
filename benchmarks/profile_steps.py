"""A shipped engine profile against step records it was not fitted on (issue 8; docs/gpu-closed-loop.md, "The
profiles out of sample: long contexts and wide batches"). Analysis of stored records only, no timing.

Each stored probe record of a run (``calibration-redo.jsonl``: plain target steps, whole speculative cycles) is
priced by the entries of the shipped profile that an answer prices it by, through the product's own path
(``gpu_closed_loop.shipped_profile`` -> ``calibration.fit.step_points`` / ``predict_points``): n-gram's cycles by
the profile's target entry, a head's cycles by its drafter entry, and the target's plain steps by both (an answer
naming a head prices its baseline by the head's entry: one fit for both sides of the ratio).

    python -m benchmarks.profile_steps benchmarks/data/h100-vllm0.24-head-context/{c1024,c4096,wide,ngram1024} \
        --gpu H100-SXM [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

HEAD_METHODS = ("eagle", "eagle3")  # drafters whose engine path (Model Runner V2, async) has its own profile entry


@dataclass(frozen=True)
class PricedStep:
    run: str
    kind: str  # "step" (plain decode) or "cycle" (a whole speculative cycle)
    method: str | None  # the cycle's speculative method
    entry: str  # the profile's entry that priced it: "target" or a drafter's catalog name
    batch_size: int
    context_tokens: int  # mean context over the timed steps
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1.0


def price_run(workdir: Path, gpu_name: str, vllm_version: str = "0.24") -> list[PricedStep]:
    """Every plain step and uniform cycle of ``workdir``'s records, priced by the profile's entry for its engine."""
    from benchmarks import gpu_closed_loop as gcl
    from calibration.fit import predict_points, step_points

    profile = gcl.shipped_profile(vllm_version, gpu_name)
    records = gcl.load_jsonl(workdir / "calibration-redo.jsonl")
    gpu, target, draft = gcl.catalog_specs(gcl.run_drafter(records), gpu_name)
    target_path, models = gcl.fit_models(records, draft)
    heads = [name for name, method in profile.drafter_methods if method in HEAD_METHODS]
    out = []
    for point in step_points(records, target, target_path, models):
        if point.draft is not None:
            entries = [point.draft.name]
        else:  # a head's answer prices its baseline's plain steps by the head's entry too
            entries = ["target", *heads] if point.kind == "step" else ["target"]
        for entry in entries:
            params = profile.step_time if entry == "target" else profile.drafter_step(entry)
            if params is None:
                continue
            seconds = float(predict_points([point], gpu, params)[0])
            out.append(PricedStep(workdir.name, point.kind, point.method if point.kind == "cycle" else None, entry,
                                  int(point.batch), int(point.context), point.seconds * 1e3, seconds * 1e3))
    return out


def format_table(rows: list[PricedStep]) -> str:
    lines = ["| run | step | entry | B | context | measured ms | predicted ms | error |",
             "|---|---|---|--:|--:|--:|--:|--:|"]
    for r in rows:
        what = r.kind if r.method is None else f"{r.method} cycle"
        lines.append(f"| {r.run} | {what} | {r.entry} | {r.batch_size} | {r.context_tokens} | {r.measured_ms:.2f} | "
                     f"{r.predicted_ms:.2f} | {r.error:+.1%} |")
    return "\n".join(lines)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, help="workdirs holding calibration-redo.jsonl")
    parser.add_argument("--gpu", default="H100-SXM", help="the catalog GPU whose profile prices them")
    parser.add_argument("--vllm-version", default="0.24")
    parser.add_argument("--json", type=Path, help="also write the rows here")


def main(args: argparse.Namespace) -> int:
    rows = [row for run in args.runs for row in price_run(run, args.gpu, args.vllm_version)]
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"error": r.error} for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
