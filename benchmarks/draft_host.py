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
``free2``    nothing done again (does the first condition's time come back?);
``split:F/C`` this process (the engine's front end) held to cores F and the engine's child processes to cores C
             (``+`` joins cores: ``split:0/2+3``); which pairs of cores run the cycle slow finds cores that share
             a physical core (SMT siblings a VM may not show), the suspected cause of an engine start's "state";
``unpinned`` every process back on every core.

Run it once per engine start (e.g. under ``taskset``) to see whether a start lands in a "state" that holds for its
life, and where its processes ran. The output also holds the host's CPU topology as the guest sees it and the GPU's
NUMA node.

Beside each sample: the host's CPU time split over the sample (busy, steal: time a hypervisor gave to others),
the GPU's SM clock, and the CPU the engine core last ran on. Output: one JSON file.

Usage on the GPU machine (after scripts/gpu-setup.sh): ``python -m benchmarks.draft_host --workdir W --out F``.

``--drafters A,B,C`` (:func:`alternate_drafters`) instead starts one engine per catalog draft model, all alive
together, and times them in turn, round by round, so that a host phase weighs on each alike: how a draft model's
cycle scales with its layers and its bytes, which decides how the cost model prices a drafter no calibration timed.
``NAME@L`` names that model's shape at ``L`` layers (``gpu_closed_loop.catalog_row``): one width at several depths.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

CONDITIONS = ("free", "gc_off", "threads1", "pinned", "loaded", "free2")


def topology() -> dict:
    """The CPU topology the guest sees: per core its SMT siblings, core and package ids; NUMA nodes; the GPU's node."""
    def read(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    cpus = {}
    for d in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*"), key=lambda d: int(d.name[3:])):
        t = d / "topology"
        cpus[d.name] = {"siblings": read(t / "thread_siblings_list"), "core_id": read(t / "core_id"),
                        "package": read(t / "physical_package_id")}
    nodes = {d.name: read(d / "cpulist") for d in Path("/sys/devices/system/node").glob("node[0-9]*")}
    gpu_node = None
    try:
        import pynvml

        pynvml.nvmlInit()
        bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).busId
        bus = (bus.decode() if isinstance(bus, bytes) else bus).lower()[-12:]
        gpu_node = read(Path("/sys/bus/pci/devices") / bus / "numa_node")
    except Exception as exc:  # noqa: BLE001 -- a diagnostic
        gpu_node = repr(exc)
    return {"cpus": cpus, "numa_nodes": nodes, "gpu_numa_node": gpu_node}


def cores_of(text: str) -> list[int]:
    return [int(x) for x in text.split("+")]


def thread_cpus(proc) -> list[int]:
    """The CPUs a process's threads last ran on (field 39 of /proc/PID/task/TID/stat), busiest thread first."""
    rows = []
    for t in Path(f"/proc/{proc.pid}/task").iterdir():
        try:
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
            rows.append((int(f[11]) + int(f[12]), int(f[36])))  # utime + stime, processor
        except (OSError, IndexError, ValueError):
            pass
    return [cpu for _, cpu in sorted(rows, reverse=True)]


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


def speed_probe(cpu: int, stop, out: str, window_s: float = 0.05) -> None:
    """A busy loop held to one core that counts its iterations per ``window_s``, back to back: the core's speed over
    time (a host whose other tenants take the physical core's time or bandwidth slows it, with no steal time)."""
    from calibration.contention import busy_loop

    os.sched_setaffinity(0, [cpu])
    rows = []
    while not stop.is_set():
        t0 = time.time()
        rows.append((round(t0, 3), busy_loop(window_s)[0]))
    Path(out).write_text(json.dumps(rows))


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def engine_processes():
    import psutil

    me = psutil.Process()
    return [me] + me.children(recursive=True)


def set_affinity(cores: list[int], procs=None) -> None:
    for p in procs if procs is not None else engine_processes():
        try:
            p.cpu_affinity(cores)
            for t in p.threads():
                os.sched_setaffinity(t.id, cores)
        except Exception:
            pass


def cycle_sample(llm, prompts: list, params) -> dict:
    """One timed generation of ``prompts``: its cycle on vLLM's engine clock (the mean sequence's decode span over its
    cycles, tokens less the accepted drafts), the same on the wall clock, the cycles and the realised AL."""
    from calibration.probes import _engine_decode_s, read_spec_counters

    c0 = read_spec_counters(llm)
    t0, u0 = time.perf_counter(), time.time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall_s, u1 = time.perf_counter() - t0, time.time()
    d = read_spec_counters(llm) - c0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs) / len(prompts)
    steps = max(1.0, tokens - 1 - d.num_accepted_tokens / len(prompts))
    span = _engine_decode_s(outs)
    return {"unix_s": [round(u0, 3), round(u1, 3)], "cycle_ms": round(1e3 * span / steps, 3) if span else None,
            "wall_ms_per_cycle": round(1e3 * wall_s / steps, 3), "cycles": steps,
            "acceptance_length": round((tokens - 1) / steps, 3)}


def time_conditions(llm, args: argparse.Namespace, sm_clock, t_start: float) -> list[dict]:
    """One engine start: B = ``args.batch_size`` cycles timed back to back under each of ``args.conditions``."""
    import random

    from calibration.probes import _random_prompts, _sampling

    n_cores = os.cpu_count() or 1
    fixed = _random_prompts(args.batch_size, 128, random.Random(3))
    many = _sampling(0.0, args.tokens + 1, 0, False)
    llm.generate(fixed, many, use_tqdm=False)  # warm-up; caches the prompts' prefill
    samples, burners = [], []
    try:
        for cond in args.conditions:
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
            elif cond.startswith("split:"):
                front, core = cond[6:].split("/")
                set_affinity(cores_of(front), engine_processes()[:1])
                set_affinity(cores_of(core), engine_processes()[1:])
            elif cond == "unpinned":
                set_affinity(list(range(n_cores)))
            t_cond = time.perf_counter()
            while time.perf_counter() - t_cond < args.seconds:
                b0, s0, tot0 = cpu_times()
                sample = cycle_sample(llm, fixed, many)
                b1, s1, tot1 = cpu_times()
                procs = engine_processes()
                core, placed = None, {}
                try:
                    busiest = max(procs[1:], key=lambda p: p.cpu_times().user)
                    core = busiest.cpu_num()
                    placed = {"front": thread_cpus(procs[0])[:3], "core": thread_cpus(busiest)[:3]}
                except Exception:  # noqa: BLE001 -- a diagnostic
                    pass
                dt = max(1.0, tot1 - tot0)
                try:
                    state = llm.collective_rpc(core_state)[0]
                except Exception as exc:  # noqa: BLE001
                    state = {"error": repr(exc)}
                samples.append({"condition": cond, "t_s": round(time.perf_counter() - t_start, 2), **sample,
                                "host_busy": round((b1 - b0) / dt, 3), "host_steal": round((s1 - s0) / dt, 4),
                                "sm_clock_mhz": sm_clock(), "engine_core_cpu": core, "threads_on": placed,
                                "core": state})
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    finally:
        for b in burners:
            b.terminate()
        set_affinity(list(range(n_cores)))
    return samples


def _start_speed_probe(args: argparse.Namespace):
    """:func:`speed_probe` on core ``args.speed_probe`` in a forked process (None without one)."""
    if args.speed_probe is None:
        return None
    out = args.workdir / "speed-probe.json"
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    proc = ctx.Process(target=speed_probe, daemon=True, args=(args.speed_probe, stop, str(out)))
    proc.start()
    return proc, stop, out


def _stop_speed_probe(probe) -> list | None:
    if probe is None:
        return None
    proc, stop, out = probe
    stop.set()
    proc.join()
    return json.loads(out.read_text()) if out.exists() else None


def main(args: argparse.Namespace) -> int:
    if args.child:
        return drafter_child(args)
    if args.drafters:
        return alternate_drafters(args)
    import psutil

    from benchmarks.gpu_closed_loop import CALIBRATION_ACCEPTANCE, gpu_probe_config, shapes
    from calibration.probes import DrafterSpec, environment_info, start_engine, stop_engine, synthetic_rates

    args.workdir.mkdir(parents=True, exist_ok=True)
    target, draft = shapes(args.workdir)
    cfg = gpu_probe_config(target, draft).resolved(on_gpu=True)
    settings = cfg.engine_settings(target)
    spec = DrafterSpec("draft_model", 3, model=draft, draft_sample_method=None).speculative_config(
        target, synthetic_rates(CALIBRATION_ACCEPTANCE, 3))
    try:
        import pynvml

        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        sm_clock = lambda: pynvml.nvmlDeviceGetClockInfo(gpu, pynvml.NVML_CLOCK_SM)  # noqa: E731
    except Exception:
        sm_clock = lambda: None  # noqa: E731
    t_start = time.perf_counter()
    llm, startup_s = start_engine(settings, spec)
    probe = _start_speed_probe(args)
    try:
        samples = time_conditions(llm, args, sm_clock, t_start)
    finally:
        stop_engine(llm)
    speed = _stop_speed_probe(probe)
    summary = {}
    for cond in args.conditions:
        xs = [x["cycle_ms"] for x in samples if x["condition"] == cond and x["cycle_ms"]]
        if xs:
            summary[cond] = {"n": len(xs), "median_ms": round(statistics.median(xs), 2), "min_ms": min(xs),
                             "max_ms": max(xs)}
    out = {"startup_s": round(startup_s, 1), "batch_size": args.batch_size, "tokens": args.tokens,
           "cores": os.cpu_count(), "affinity_at_start": sorted(os.sched_getaffinity(0)), "topology": topology(),
           "summary": summary, "samples": samples, "speed_probe": speed, "environment": environment_info(),
           "speculative_config": spec, "psutil": psutil.__version__}
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps(out["summary"], indent=1), flush=True)
    return 0


# ------------------------------------------------------------------------------------ drafters, alternating
def drafter_child(args: argparse.Namespace) -> int:
    """Child of :func:`alternate_drafters`: one draft-model engine of the drafter ``args.child`` (the plan's engine
    settings, k = 3 at the calibration's synthetic acceptance, a 1/``args.engines`` share of the GPU and a fixed KV
    cache). After its warm-up it reports ready, then reads a batch size per line and answers each with one
    :func:`cycle_sample` (a JSON line); any other line ends it."""
    import random

    from benchmarks.gpu_closed_loop import CALIBRATION_ACCEPTANCE, gpu_probe_config
    from calibration.probes import (DrafterSpec, _random_prompts, _sampling, event_stream, held_engine_config,
                                    inspect_models_in_process, start_engine, stop_engine, synthetic_rates)

    events = event_stream()
    target, draft = args.child_shapes.split(",")
    cfg = gpu_probe_config(target, draft, drafter=args.child, max_num_seqs=max(args.batch_sizes),
                           max_model_len=args.max_model_len, kv_cache_memory_gib=args.kv_cache_gib)
    cfg = held_engine_config(cfg.resolved(on_gpu=True), args.engines)
    spec = DrafterSpec("draft_model", 3, model=draft, draft_sample_method=None).speculative_config(
        target, synthetic_rates(CALIBRATION_ACCEPTANCE, 3))
    inspect_models_in_process()
    try:
        llm, startup_s = start_engine(cfg.engine_settings(target), spec)
    except Exception as exc:  # noqa: BLE001 -- reported to the parent, which goes on with the other drafters
        events.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    try:
        params = _sampling(0.0, args.tokens + 1, 0, False)
        prompts = {b: _random_prompts(b, 128, random.Random(3)) for b in args.batch_sizes}
        for b in args.batch_sizes:  # warm-up; caches the prompts' prefill
            llm.generate(prompts[b], params, use_tqdm=False)
        events.write(json.dumps({"ready": args.child, "startup_s": round(startup_s, 1)}) + "\n")
        for line in sys.stdin:
            if not line.strip().isdigit():
                break
            events.write(json.dumps(cycle_sample(llm, prompts[int(line)], params)) + "\n")
    finally:
        stop_engine(llm)
    return 0


def _next_event(proc) -> dict:
    """The child's next JSON event (its other lines go to stderr); ``{"error": ...}`` when it has ended."""
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            return event
        sys.stderr.write(line)
    return {"error": f"exited with {proc.wait()}"}


def paired_ratios(samples: list[dict], reference: str) -> dict:
    """Per drafter and batch size: the median over rounds of its cycle over ``reference``'s in the same round (the
    two samples seconds apart, so one host state), with the rounds' p10 and p90."""
    import numpy as np

    by = {(x["drafter"], x["batch_size"], x["round"]): x["cycle_ms"] for x in samples if x.get("cycle_ms")}
    out: dict[str, dict] = {}
    for (name, b, r), ms in sorted(by.items()):
        ref = by.get((reference, b, r))
        if name != reference and ref:
            out.setdefault(f"{name}@{b}", []).append(ms / ref)
    return {key: {"n": len(v), "median": round(float(np.median(v)), 4),
                  "p10": round(float(np.percentile(v, 10)), 4), "p90": round(float(np.percentile(v, 90)), 4)}
            for key, v in out.items()}


def pooled_ratios(starts: list[dict], reference: str) -> dict:
    """:func:`paired_ratios` over every engine start of a run (a round is one start's round)."""
    return paired_ratios([{**x, "round": (x["start"], x["round"])} for st in starts for x in st["samples"]], reference)


def alternate_drafters(args: argparse.Namespace) -> int:
    """Draft models of different sizes and depths, each in its own engine (all alive together, the 8B-shaped
    target, k = 3), timed in turn: one generation per drafter and batch size per round, every second round in
    reverse order (A B C, C B A), for ``args.seconds``. Samples of one round lie seconds apart, in one host state,
    so their ratios tell how a drafter's cycle scales with its layers and bytes (the stand-in rule for drafters a
    calibration did not time) apart from the host's phases. ``args.starts`` times over, each with fresh engines."""
    import signal
    import subprocess

    from benchmarks.gpu_closed_loop import shapes
    from calibration.probes import environment_info

    args.workdir.mkdir(parents=True, exist_ok=True)
    paths = {name: shapes(args.workdir, name) for name in args.drafters}
    probe = _start_speed_probe(args)
    t_start, starts = time.perf_counter(), []
    for start in range(args.starts):
        procs = {}
        for name in args.drafters:
            argv = [sys.executable, "-m", "benchmarks.draft_host", "--child", name, "--child-shapes",
                    ",".join(paths[name]), "--engines", str(len(args.drafters)), "--tokens", str(args.tokens),
                    "--batch-sizes", ",".join(map(str, args.batch_sizes)), "--kv-cache-gib", str(args.kv_cache_gib),
                    "--max-model-len", str(args.max_model_len)]
            procs[name] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           start_new_session=True)
        ready, errors, samples = {}, {}, []
        try:
            for name, proc in procs.items():
                event = _next_event(proc)
                if "ready" in event:
                    ready[name] = event["startup_s"]
                else:
                    errors[name] = event.get("error")
            print(json.dumps({"start": start, "ready": ready, "errors": errors}), file=sys.stderr, flush=True)
            live = [n for n in args.drafters if n in ready]
            t_rounds, r = time.perf_counter(), 0
            while len(live) > 1 and time.perf_counter() - t_rounds < args.seconds:
                for b in args.batch_sizes:
                    for name in live if r % 2 == 0 else live[::-1]:
                        procs[name].stdin.write(f"{b}\n")
                        procs[name].stdin.flush()
                        event = _next_event(procs[name])
                        samples.append({"drafter": name, "batch_size": b, "round": r, "start": start,
                                        "t_s": round(time.perf_counter() - t_start, 2), **event})
                        print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
                r += 1
        finally:
            for proc in procs.values():
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        starts.append({"startup_s": ready, "errors": errors, "rounds": r, "samples": samples,
                       "ratios": paired_ratios(samples, args.drafters[0]) if samples else {}})
    summary = {}
    for name in args.drafters:
        for b in args.batch_sizes:
            per = [[x["cycle_ms"] for x in st["samples"] if x["drafter"] == name and x["batch_size"] == b
                    and x.get("cycle_ms")] for st in starts]
            summary[f"{name}@{b}"] = [round(statistics.median(xs), 2) if xs else None for xs in per]
    pooled = pooled_ratios(starts, args.drafters[0])
    out = {"drafters": args.drafters, "batch_sizes": args.batch_sizes, "tokens": args.tokens,
           "median_cycle_ms_per_start": summary, "ratios_to_first": pooled, "starts": starts,
           "speed_probe": _stop_speed_probe(probe), "environment": environment_info()}
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps({"median_cycle_ms_per_start": summary, "ratios_to_first": pooled}, indent=1), flush=True)
    return 0


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/draft-host"))
    parser.add_argument("--out", type=Path, default=Path("draft-host.json"))
    parser.add_argument("--seconds", type=float, default=25.0, help="per condition")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per timed generation")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--conditions", type=lambda t: t.split(","), default=list(CONDITIONS),
                        help="comma-separated, in order: " + ", ".join(CONDITIONS) + ", split:F/C, unpinned")
    parser.add_argument("--speed-probe", type=int, default=None, metavar="CPU",
                        help="also time a busy loop held to this core through the run (its speed over time)")
    ints = lambda t: [int(x) for x in t.split(",")]  # noqa: E731
    parser.add_argument("--drafters", type=lambda t: t.split(","), default=None, metavar="A,B,...",
                        help="catalog draft models, each in its own engine, timed in turn (alternate_drafters); "
                             "ratios are to the first; NAME@L is that model cut or stretched to L layers")
    parser.add_argument("--batch-sizes", type=ints, default=[1], help="with --drafters")
    parser.add_argument("--starts", type=int, default=1, help="with --drafters: times over, with fresh engines")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="with --drafters: each engine's KV cache")
    parser.add_argument("--max-model-len", type=int, default=1024, help="with --drafters")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-shapes", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--engines", type=int, default=1, help=argparse.SUPPRESS)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(p)
    sys.exit(main(p.parse_args()))
