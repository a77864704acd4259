"""Interleaved A/B of two source trees under gunicorn (issue 10): POST throughput and worker CPU per POST.

Single benchmark runs on this shared 2-core machine spread more than the changes they are meant to show, so two
trees (e.g. main and a branch) are compared in alternation: for each round, each tree's API is started with the
same gunicorn settings (``benchmarks.service_load.Server``), warmed up for a second, then driven for ``--seconds``
with distinct POST scenarios; the order of the trees alternates between rounds. Each tree has its own fresh
database (SQLite, or ``--database-url`` + the tree's index, e.g. ``postgresql://postgres@127.0.0.1:5432/ab`` →
``ab0``, ``ab1``, which must exist and be empty). Printed per run and summarised: requests/s and the CPU seconds
the gunicorn workers used per request (user + system, from /proc), whose median is steadier than requests/s.

    flock /tmp/specadvisor-cpu.lock python -m benchmarks.service_ab /work/main /work/wtX --rounds 4
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.service_load import Server, _request, run_load, scenario


def main(args: argparse.Namespace) -> dict:
    trees = [Path(t).resolve() for t in args.trees]
    envs = {}
    for index, tree in enumerate(trees):
        tmp = tempfile.mkdtemp(prefix=f"specadvisor-ab{index}-")
        url = f"{args.database_url}{index}" if args.database_url else f"sqlite:///{tmp}/load.db"
        subprocess.run([sys.executable, "-c", f"from benchmarks.service_load import prepare_database as p; p({url!r})"],
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True, capture_output=True)
        envs[tree] = {"DATABASE_URL": url, "SPECADVISOR_INSTANCE": tmp}
    counter = iter(range(30 * 10**6, 10**12))
    post = lambda i: _request("POST", "/v1/recommendations", json.dumps(scenario(next(counter))).encode())  # noqa
    runs: dict[Path, list[dict]] = {tree: [] for tree in trees}
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            server = Server(envs[tree], None, args.workers, args.threads, root=tree)
            try:
                run_load(server.port, post, clients=args.clients, seconds=1.0)  # warm up
                before = server.worker_cpu_s()
                result = run_load(server.port, post, clients=args.clients, seconds=args.seconds)
                cpu_ms = (server.worker_cpu_s() - before) / max(result.requests, 1) * 1e3
                if set(result.statuses) - {"201"}:  # show why (the server's log)
                    server.log.seek(0)
                    print(server.log.read()[-4000:].decode(errors="replace"), file=sys.stderr)
            finally:
                server.stop()
            run = {**result.summary(), "label": f"{tree.name}/{round_ + 1}", "worker_cpu_ms": round(cpu_ms, 2)}
            runs[tree].append(run)
            print(json.dumps(run), flush=True)
    summary = {str(tree): {"mean_rps": round(statistics.mean(r["rps"] for r in runs[tree]), 1),
                           "median_worker_cpu_ms": round(statistics.median(r["worker_cpu_ms"] for r in runs[tree]), 2),
                           "runs": runs[tree]} for tree in trees}
    print()
    for tree, s in summary.items():
        print(f"{tree}: {s['mean_rps']:.0f} POST/s (mean), {s['median_worker_cpu_ms']:.2f} ms worker CPU per POST (median)")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="two source trees (checkouts) to compare")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--database-url", default="", help="a PostgreSQL URL prefix; default: fresh SQLite files")
    parser.add_argument("--json", type=Path, help="also write the results here")
    arguments = parser.parse_args()
    result = main(arguments)
    if arguments.json:
        arguments.json.write_text(json.dumps(result, indent=2))
