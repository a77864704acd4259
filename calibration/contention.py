"""Timing on a shared machine: measure how much CPU other processes took while a probe ran, and redo the probe
when they took too much. CPU hosts time the engine's own compute on the cores; GPU nodes too, since host time is
part of a step (a separate draft model in vLLM 0.24 runs bound by one host core: docs/gpu-closed-loop.md, run 5)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

OTHERS_CPU_LIMIT = 0.12  # redo a measurement when other processes took more than this share of the CPUs
ENGINE_CORES = 3  # cores an engine's timing needs to itself: engine core, front end, the probe


def others_limit(cores: int | None = None) -> float:
    """Share of all CPUs other processes may take during a timing: OTHERS_CPU_LIMIT on a small host (2 cores: a
    quarter of one), and on a many-core node all but ENGINE_CORES (16 cores: 81 %). Measured on an H200 node
    (benchmarks/draft_host.py): a 0.24 draft-model cycle took 24 ms with the host quiet, 38 ms with 14 of 16
    cores busy."""
    n = cores or os.cpu_count() or 1
    return max(OTHERS_CPU_LIMIT, 1.0 - ENGINE_CORES / n)


class Contention:
    """Share of all CPUs used by processes outside this process tree since ``start()`` (/proc; 0 without it).

    The 2 cores are shared with other jobs: a measurement taken while they run is redone (``guarded``)."""

    def __init__(self) -> None:
        self.start()

    @staticmethod
    def _sample() -> tuple[int, int, int]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0, 0
        total = sum(fields[:8])
        busy = total - fields[3] - (fields[4] if len(fields) > 4 else 0)
        parent: dict[int, int] = {}
        ticks: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                rest = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parent[int(d)] = int(rest[1])
            ticks[int(d)] = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])  # + reaped children
        me, ours = os.getpid(), 0
        for pid, t in ticks.items():
            p, hops = pid, 0
            while p not in (0, 1, me) and hops < 50:
                p, hops = parent.get(p, 0), hops + 1
            if p == me:
                ours += t
        return total, busy, ours

    def start(self) -> None:
        self.s0 = self._sample()

    def others(self) -> float:
        t1, b1, o1 = self._sample()
        t0, b0, o0 = self.s0
        return max(0.0, (b1 - b0) - (o1 - o0)) / max(t1 - t0, 1)


def wait_others_quiet(max_wait_s: float = 180.0, limit: float | None = None) -> float:
    """Wait (at most ``max_wait_s``) until other processes take less than ``limit`` of the CPUs (default: two
    thirds of :func:`others_limit`, 8 % on 2 cores); returns their last share."""
    limit = 2 / 3 * others_limit() if limit is None else limit
    deadline, others = time.monotonic() + max_wait_s, 1.0
    while time.monotonic() < deadline:
        c = Contention()
        time.sleep(2.0)
        others = c.others()
        if others < limit:
            break
    return others


def guarded(measure, label: str, attempts: int = 4):
    """Run ``measure()``; redo it (after waiting for quiet) while other processes used more than
    :func:`others_limit` of the CPUs. Returns (the least disturbed attempt's result, others' CPU share during it)."""
    best, limit = None, others_limit()
    for attempt in range(attempts):
        c = Contention()
        result = measure()
        others = c.others()
        if best is None or others < best[1]:
            best = (result, others)
        if others <= limit:
            break
        print(f"[{label}] other processes used {100 * others:.0f} % of the CPUs: redoing", file=sys.stderr,
              flush=True)
        if attempt < attempts - 1:
            wait_others_quiet()
    return best
