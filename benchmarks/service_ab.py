"""Interleaved A/B of two source trees under gunicorn (issue 10): throughput and worker CPU per request.

Single benchmark runs on this shared 2-core machine spread more than the changes they are meant to show, so two
trees (e.g. main and a branch) are compared in alternation: for each round, each tree's API is started with the
same gunicorn settings (``benchmarks.service_load.Server``), warmed up for a second, then driven for ``--seconds``
with ``--scenario``'s requests (``post``: distinct POST scenarios; ``get``, ``list``, ``list-keyset``: the reads of
``benchmarks/service_load.py``, over ``--stored`` answers POSTed to each tree's database first); the order of the
trees alternates between rounds. Each tree has its own fresh
database (SQLite, or ``--database-url`` + the tree's index, e.g. ``postgresql://postgres@127.0.0.1:5432/ab`` →
``ab0``, ``ab1``, which must exist and be empty). Printed per run and summarised: requests/s and the CPU seconds
the gunicorn workers used per request (user + system, from /proc), whose median is steadier than requests/s; with
PostgreSQL, its backends' CPU per request; and the whole machine's busy CPU per request (the load generator, the
database and anything else running).

    flock /tmp/specadvisor-cpu.lock python -m benchmarks.service_ab /work/main /work/wtX --rounds 4
    flock /tmp/specadvisor-cpu.lock python -m benchmarks.service_ab /work/main /work/wtX --scenario get --rounds 6
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.service_load import READS, Server, _request, run_load, scenario, vacuum


def _host_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle or waiting on I/O), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _backend_cpu_s(database: str | None) -> float:
    """CPU seconds used so far by the PostgreSQL backends serving ``database`` (0 without one)."""
    if not database:
        return 0.0
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
            if not command.startswith(b"postgres: ") or f" {database} ".encode() not in command:
                continue
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


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
    requests, expected = post, "201"
    if args.scenario != "post":
        for tree in trees:  # the same answers in each tree's database
            stored = iter(range(args.stored))
            server = Server(envs[tree], None, args.workers, args.threads, root=tree)
            try:
                run_load(server.port, lambda i: _request("POST", "/v1/recommendations", json.dumps(  # noqa: B023
                    scenario(next(stored))).encode()), clients=args.clients, total=args.stored)  # noqa: B023
            finally:
                server.stop()
            vacuum(envs[tree]["DATABASE_URL"])
        rng, read = random.Random(7), READS[args.scenario]
        requests, expected = (lambda i: read(rng, args.stored, i)), "200"
    runs: dict[Path, list[dict]] = {tree: [] for tree in trees}
    for round_ in range(args.rounds):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            server = Server(envs[tree], None, args.workers, args.threads, root=tree)
            try:
                run_load(server.port, requests, clients=args.clients, seconds=1.0)  # warm up
                database = envs[tree]["DATABASE_URL"].rsplit("/", 1)[1] if args.database_url else None
                before, host, backend = server.worker_cpu_s(), _host_busy_s(), _backend_cpu_s(database)
                result = run_load(server.port, requests, clients=args.clients, seconds=args.seconds)
                after, n = server.worker_cpu_s(), max(result.requests, 1)
                host, backend = (_host_busy_s() - host) / n * 1e3, (_backend_cpu_s(database) - backend) / n * 1e3
                user_ms, sys_ms = ((b - a) / n * 1e3 for a, b in zip(before, after))
                if set(result.statuses) - {expected}:  # show why (the server's log)
                    server.log.seek(0)
                    print(server.log.read()[-4000:].decode(errors="replace"), file=sys.stderr)
            finally:
                server.stop()
            run = {**result.summary(), "label": f"{tree.name}/{round_ + 1}",
                   "worker_cpu_ms": round(user_ms + sys_ms, 3), "worker_user_ms": round(user_ms, 3),
                   "worker_sys_ms": round(sys_ms, 3), "backend_cpu_ms": round(backend, 3),
                   "host_busy_ms": round(host, 3)}
            runs[tree].append(run)
            print(json.dumps(run), flush=True)
    summary = {str(tree): {"mean_rps": round(statistics.mean(r["rps"] for r in runs[tree]), 1),
                           **{f"median_{key}": round(statistics.median(r[key] for r in runs[tree]), 3)
                              for key in ("worker_cpu_ms", "backend_cpu_ms", "host_busy_ms")},
                           "runs": runs[tree]} for tree in trees}
    print()
    for tree, s in summary.items():
        print(f"{tree}: {s['mean_rps']:.0f} {args.scenario} req/s (mean), "
              f"{s['median_worker_cpu_ms']:.3f} ms worker CPU per request (median), backends "
              f"{s['median_backend_cpu_ms']:.3f} ms, machine busy {s['median_host_busy_ms']:.3f} ms")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="two source trees (checkouts) to compare")
    parser.add_argument("--scenario", default="post", choices=("post", *READS))
    parser.add_argument("--stored", type=int, default=2000, help="answers stored before a read scenario")
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
