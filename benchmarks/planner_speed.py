"""Speed of a capacity plan (issue 12 target: 9 GPUs × 3 TP × 2 modes × 3 loads in under 2 s).

Times ``POST /v1/plans`` with the README's plan example (every priced catalog GPU, default TP sizes and speculators,
three load levels) through the Flask test client on a throwaway SQLite database: validation, catalog lookups, the
planner (:func:`advisor.costmodel.plan.plan_capacity`) and storage, as the service runs them. Prints the median and
the slowest of ``--repeats`` runs, the number of options and of simulated rates.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

TARGET_S = 2.0
README_PLAN = {
    "target_model": "llama-3.1-8b-instruct",
    "workload": {"prompt_tokens": 512, "output_tokens": 256, "temperature": 0.0, "structure": "code"},
    "load": {"requests_per_second": 40, "growth": [1, 2, 5]},
    "slo": {"percentile": 90, "ttft_ms": 1000, "tpot_ms": 50},
}


@dataclass
class SpeedResult:
    median_s: float
    max_s: float
    repeats: int
    options: int
    gpus: int
    simulations: int


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spec", default=None, help="a plan request (JSON) instead of the README's example")
    parser.add_argument("--json", action="store_true")


def run(body: dict, repeats: int) -> SpeedResult:
    import advisor.costmodel.plan as plan_module
    from advisor import create_app

    count = {"n": 0}
    real = plan_module.simulate

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        count["n"] += 1
        return real(*args, **kwargs)

    tmp = tempfile.mkdtemp(prefix="planner-speed-")
    app = create_app({"SQLALCHEMY_DATABASE_URI": f"sqlite:///{tmp}/plans.db", "INSTANCE_PATH": tmp, "REDIS_URL": ""})
    client = app.test_client()
    times, answer = [], None
    plan_module.simulate = counted
    try:
        for _ in range(repeats):
            count["n"] = 0
            t = time.perf_counter()
            response = client.post("/v1/plans", json=body)
            times.append(time.perf_counter() - t)
            if response.status_code != 201:
                raise RuntimeError(response.get_data(as_text=True))
            answer = response.get_json()
    finally:
        plan_module.simulate = real
    return SpeedResult(statistics.median(times), max(times), repeats, len(answer["options"]),
                       len({o["gpu"] for o in answer["options"]}), count["n"])


def main(args: argparse.Namespace) -> int:
    body = json.loads(Path(args.spec).read_text()) if args.spec else README_PLAN
    result = run(body, args.repeats)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(f"{result.options} options over {result.gpus} GPUs, {result.simulations} simulated rates: "
              f"median {result.median_s:.2f} s, slowest {result.max_s:.2f} s over {result.repeats} runs "
              f"(target < {TARGET_S:g} s)")
    return 0 if result.median_s < TARGET_S else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cli_args(p)
    raise SystemExit(main(p.parse_args()))
