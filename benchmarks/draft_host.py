"""Why does a draft-model cycle in vLLM 0.24 take ~25 ms on one GPU node and ~50 ms on another (issue 8)?

vLLM 0.24 runs a separate draft model without CUDA graphs, so its cycle is bound by the host. This experiment
starts one draft-model engine (the GPU closed loop's 8B-shaped target and 1B-shaped drafter, k = 3, synthetic
acceptance 0.7; the product's ``calibration.probes`` engine settings) and times B = 1 cycles back to back on vLLM's
engine clock, one sample per generation of ``--tokens`` tokens, under conditions applied in turn:

``free``     nothing done;
``gc_off``   Python's garbage collector off in the engine core (``LLM.collective_rpc``: the worker of a TP = 1
             engine runs in the engine core's process), what it holds frozen;
``threads1`` also torch's intra-op threads set to 1 there;
``pinned``   the engine's processes (this one and its children) held to two cores;
``loaded``   every core but two kept busy by spinning processes (a noisy host);
``free2``    nothing done again (does the first condition's time come back?).

Beside each sample: the host's CPU time split over the sample (busy, steal: time a hypervisor gave to others),
the GPU's SM clock, and the CPU the engine core last ran on. Output: one JSON file.

Usage on the GPU machine (after scripts/gpu-setup.sh): ``python -m benchmarks.draft_host --workdir W --out F``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

CONDITIONS = ("free", "gc_off", "threads1", "pinned", "loaded", "free2")


def cpu_times() -> tuple[float, float, float]:
    """(busy, steal, total) jiffies of the whole host, from /proc/stat."""
    parts = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (parts + [0.0] * 8)[:8]
    total = sum(parts[:8])
    return user + nice + system + irq + softirq, steal, total


def core_state(worker=None) -> dict:
    """Worker side: the engine core's garbage-collector runs, torch threads and CPU affinity."""
    import gc

    import torch

    return {"gc_collections": [g["collections"] for g in gc.get_stats()], "gc_enabled": gc.isenabled(),
            "torch_threads": torch.get_num_threads(), "affinity": len(os.sched_getaffinity(0)), "pid": os.getpid()}


def core_gc_off(worker=None) -> bool:
    import gc

    gc.collect()
    gc.freeze()
    gc.disable()
    return True


def core_threads(worker=None, n: int = 1) -> bool:
    import torch

    torch.set_num_threads(n)
    return True


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def engine_processes():
    import psutil

    me = psutil.Process()
    return [me] + me.children(recursive=True)


def set_affinity(cores: list[int]) -> None:
    for p in engine_processes():
        try:
            p.cpu_affinity(cores)
            for t in p.threads():
                os.sched_setaffinity(t.id, cores)
        except Exception:
            pass


def main(args: argparse.Namespace) -> int:
    import psutil

    from benchmarks.gpu_closed_loop import CALIBRATION_ACCEPTANCE, gpu_probe_config, shapes
    from calibration.probes import (DrafterSpec, _engine_decode_s, _random_prompts, _sampling, environment_info,
                                    read_spec_counters, start_engine, stop_engine, synthetic_rates)
    import random

    args.workdir.mkdir(parents=True, exist_ok=True)
    target, draft = shapes(args.workdir)
    cfg = gpu_probe_config(target, draft).resolved(on_gpu=True)
    settings = cfg.engine_settings(target)
    spec = DrafterSpec("draft_model", 3, model=draft, draft_sample_method=None).speculative_config(
        target, synthetic_rates(CALIBRATION_ACCEPTANCE, 3))
    llm, startup_s = start_engine(settings, spec)
    try:
        import pynvml

        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        sm_clock = lambda: pynvml.nvmlDeviceGetClockInfo(gpu, pynvml.NVML_CLOCK_SM)  # noqa: E731
    except Exception:
        sm_clock = lambda: None  # noqa: E731
    n_cores = os.cpu_count() or 1
    rng = random.Random(3)
    fixed = _random_prompts(args.batch_size, 128, rng)
    many = _sampling(0.0, args.tokens + 1, 0, False)
    llm.generate(fixed, many, use_tqdm=False)  # warm-up; caches the prompts' prefill
    samples, burners = [], []
    t_start = time.perf_counter()
    try:
        for cond in CONDITIONS:
            if cond == "gc_off":
                llm.collective_rpc(core_gc_off)
            elif cond == "threads1":
                llm.collective_rpc(core_threads, args=(1,))
            elif cond == "pinned":
                set_affinity([2, 3])
            elif cond == "loaded":
                set_affinity(list(range(n_cores)))
                stop_at = time.time() + args.seconds + 5
                burners = [multiprocessing.get_context("fork").Process(target=spin, args=(stop_at,), daemon=True)
                           for _ in range(max(0, n_cores - 2))]
                for b in burners:
                    b.start()
            elif cond == "free2":
                for b in burners:
                    b.terminate()
                burners = []
            t_cond = time.perf_counter()
            while time.perf_counter() - t_cond < args.seconds:
                b0, s0, tot0 = cpu_times()
                c0 = read_spec_counters(llm)
                t0 = time.perf_counter()
                outs = llm.generate(fixed, many, use_tqdm=False)
                wall_s = time.perf_counter() - t0
                d = read_spec_counters(llm) - c0
                b1, s1, tot1 = cpu_times()
                tokens = sum(len(o.outputs[0].token_ids) for o in outs) / args.batch_size
                steps = max(1.0, tokens - 1 - d.num_accepted_tokens / args.batch_size)
                span = _engine_decode_s(outs)
                core = None
                try:
                    core = max((p for p in engine_processes()[1:]), key=lambda p: p.cpu_times().user).cpu_num()
                except Exception:
                    pass
                dt = max(1.0, tot1 - tot0)
                try:
                    state = llm.collective_rpc(core_state)[0]
                except Exception as exc:
                    state = {"error": repr(exc)}
                samples.append({"condition": cond, "t_s": round(time.perf_counter() - t_start, 2),
                                "cycle_ms": round(1e3 * span / steps, 3) if span else None,
                                "wall_ms_per_cycle": round(1e3 * wall_s / steps, 3), "cycles": steps,
                                "host_busy": round((b1 - b0) / dt, 3), "host_steal": round((s1 - s0) / dt, 4),
                                "sm_clock_mhz": sm_clock(), "engine_core_cpu": core, "core": state})
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    finally:
        for b in burners:
            b.terminate()
        stop_engine(llm)
    summary = {}
    for cond in CONDITIONS:
        xs = [s["cycle_ms"] for s in samples if s["condition"] == cond and s["cycle_ms"]]
        if xs:
            summary[cond] = {"n": len(xs), "median_ms": round(statistics.median(xs), 2), "min_ms": min(xs),
                             "max_ms": max(xs)}
    out = {"startup_s": round(startup_s, 1), "batch_size": args.batch_size, "tokens": args.tokens,
           "cores": n_cores, "summary": summary, "samples": samples, "environment": environment_info(),
           "speculative_config": spec, "psutil": psutil.__version__}
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps(summary, indent=1), flush=True)
    return 0


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/draft-host"))
    parser.add_argument("--out", type=Path, default=Path("draft-host.json"))
    parser.add_argument("--seconds", type=float, default=25.0, help="per condition")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per timed generation")
    parser.add_argument("--batch-size", type=int, default=1)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(p)
    sys.exit(main(p.parse_args()))
