"""Timing on a shared machine: measure how much CPU other processes took while a probe ran, and redo the probe
when they took too much. CPU hosts time the engine's own compute on the cores; GPU nodes too, since host time is
part of a step (a separate draft model in vLLM 0.24 runs bound by one host core: docs/gpu-closed-loop.md, run 5)."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np

OTHERS_CPU_LIMIT = 0.12  # redo a measurement when other processes took more than this share of the CPUs
ENGINE_CORES = 3  # cores an engine's timing needs to itself: engine core, front end, the probe
# Seconds one process may spend waiting for quiet over all its guarded measurements. Without a bound, a host busy
# all along (another tenant, CPU steal on a shared VM) made each measurement wait up to 180 s three times: a
# calibration of ~3 min ran past 16 min in a clean-clone CI on 2026-12-02. Once spent, timings go on under load
# and each records the share others took (``others_cpu``), so the fit's spread carries it.
WAIT_BUDGET_S = float(os.environ.get("SPECADVISOR_CONTENTION_WAIT_S", "300"))


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


class WaitBudget:
    """Seconds left for waiting out contention, shared by every guarded measurement of one process."""

    def __init__(self, seconds: float) -> None:
        self.left_s = max(0.0, seconds)

    def spend(self, seconds: float) -> None:
        self.left_s = max(0.0, self.left_s - seconds)


BUDGET = WaitBudget(WAIT_BUDGET_S)


def wait_others_quiet(max_wait_s: float = 180.0, limit: float | None = None,
                      budget: WaitBudget | None = None) -> float:
    """Wait (at most ``max_wait_s``, and at most what ``budget`` has left) until other processes take less than
    ``limit`` of the CPUs (default: two thirds of :func:`others_limit`, 8 % on 2 cores); returns their last share."""
    limit = 2 / 3 * others_limit() if limit is None else limit
    if budget is not None:
        max_wait_s = min(max_wait_s, budget.left_s)
    start = time.monotonic()
    deadline, others = start + max_wait_s, 1.0
    while time.monotonic() < deadline:
        c = Contention()
        time.sleep(2.0)
        others = c.others()
        if others < limit:
            break
    if budget is not None:
        budget.spend(time.monotonic() - start)
    return others


def guarded(measure, label: str, attempts: int = 4, budget: WaitBudget | None = BUDGET):
    """Run ``measure()``; redo it (after waiting for quiet) while other processes used more than
    :func:`others_limit` of the CPUs and ``budget`` has waiting time left (None: unbounded). Returns (the least
    disturbed attempt's result, others' CPU share during it)."""
    best, limit = None, others_limit()
    for attempt in range(attempts):
        c = Contention()
        result = measure()
        others = c.others()
        if best is None or others < best[1]:
            best = (result, others)
        if others <= limit or attempt == attempts - 1:
            break
        if budget is not None and budget.left_s <= 0:
            print(f"[{label}] other processes used {100 * others:.0f} % of the CPUs; the wait budget is spent: "
                  "keeping it", file=sys.stderr, flush=True)
            break
        print(f"[{label}] other processes used {100 * others:.0f} % of the CPUs: redoing", file=sys.stderr,
              flush=True)
        wait_others_quiet(budget=budget)
    return best


# --------------------------------------------------------------------------------------------- the host's speed
HOST_SPEED_WINDOW_S = 0.05
HOST_SPEED_ON_CPU = 0.95  # a reading counts when the loop ran this share of its window (not waiting for a core)


def busy_loop(window_s: float) -> tuple[int, float]:
    """A busy loop's iterations over ``window_s``, and the share of the window it ran (its CPU time over the wall
    time: below 1 when other processes of the guest took its core)."""
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    while time.perf_counter() - t0 < window_s:
        n += 1
    return n, (time.process_time() - c0) / (time.perf_counter() - t0)


def _count_loop(conn, interval_s: float, window_s: float) -> None:
    """Child: a :func:`busy_loop` every ``interval_s``; send the readings when told to stop (or end quietly when the
    parent is gone: its end of the pipe closed)."""
    readings = []
    while not conn.poll(max(0.0, interval_s - window_s)):
        readings.append(busy_loop(window_s))
    try:
        conn.send(readings)
        conn.close()
    except OSError:  # the parent died (a killed probe run): nobody to tell
        pass


class HostSpeed:
    """The speed of the host's cores over a run: a child process counts a busy loop's iterations over 50 ms once
    per ``interval_s`` (5 % of one core), on whichever core the scheduler gives it.

    On a cloud node other tenants slow the physical cores under its vCPUs, and the guest sees neither steal time
    nor a lower clock. Steps that run on the host follow it: a separate draft model on vLLM 0.24, n-gram's lookup,
    piecewise-graph verify steps. On the lent H200 each core swung 1.7-1.8x (p5 to p95) in phases of seconds to
    minutes (docs/gpu-closed-loop.md, "The host's cores change speed on their own"). A reading taken while the
    guest's own processes kept the loop off its core (engine starts compiling on every core) measures them, not the
    core: only readings that ran at least ``HOST_SPEED_ON_CPU`` of their window count."""

    def __init__(self, interval_s: float = 1.0, window_s: float = HOST_SPEED_WINDOW_S) -> None:
        # at most half of one core, whatever a request's engine settings asked for
        self.interval_s, self.window_s = max(float(interval_s), 2 * window_s), window_s
        self._proc = self._conn = None
        self._t0 = 0.0

    def start(self) -> "HostSpeed":
        ctx = multiprocessing.get_context("spawn")  # not a fork of a process that may hold engine threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_count_loop, args=(child, self.interval_s, self.window_s), daemon=True)
        self._proc.start()
        self._t0 = time.monotonic()
        return self

    def stop(self) -> dict | None:
        """The run's summary (None if under two readings ran on their core): iterations per window at p5 / p50 /
        p95, the swing p95 / p5, every counted window's iterations in order, and how many readings were left out
        off-CPU."""
        if self._proc is None:
            return None
        readings: list[tuple[int, float]] = []
        try:
            self._conn.send("stop")
            if self._conn.poll(10.0):
                readings = self._conn.recv()
        except (OSError, EOFError):
            pass
        counts = [n for n, on_cpu in readings if on_cpu >= HOST_SPEED_ON_CPU]
        self._proc.join(5.0)
        if self._proc.is_alive():
            self._proc.kill()
        wall_s, self._proc = time.monotonic() - self._t0, None
        if len(counts) < 2:
            return None
        p5, p50, p95 = (float(x) for x in np.percentile(counts, [5, 50, 95]))
        return {"interval_s": self.interval_s, "window_s": self.window_s, "wall_s": round(wall_s, 1),
                "readings_off_cpu": len(readings) - len(counts), "iterations": [int(c) for c in counts],
                "iterations_p5": p5, "iterations_p50": p50, "iterations_p95": p95,
                "swing": round(p95 / max(p5, 1.0), 3)}
