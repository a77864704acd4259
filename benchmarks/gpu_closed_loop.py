"""The GPU closed loop (issue 8): calibrate with the product's probe plan on a GPU, then measure end-to-end
speedups through vLLM and compare them with what ``advisor.costmodel.predict`` says from that calibration.

Three phases, each its own command:

``calibrate`` (on the GPU)  -- ``calibration.probes.run_probes`` with the GPU plan below: an 8B-shaped target and a
                             1B-shaped draft model, dummy weights (config only), CUDA graphs, every engine in its own
                             process; records as JSON lines.
``measure`` (on the GPU)    -- one engine per (method, k, synthetic acceptance) and a baseline; at each batch size B
                             a batch of B requests (P-token prompts, O output tokens, greedy, ignore_eos) is timed
                             for O tokens and for 1 token; decode time = the difference. vLLM's counters say how many
                             drafts were made and accepted. Engines already measured (in ``--workdir``) are skipped,
                             so a second command continues where a time limit stopped the first. With
                             ``--steady``, at each B the engine instead serves B requests in flight, each one that
                             finishes replaced at once by the next (:func:`steady_state`: a server at concurrency B,
                             what an answer's ``concurrency`` means), then one batch that starts together, into
                             ``steady.jsonl``; ``benchmarks/gpu_steady_state.py`` compares it with ``predict``.
``analyze`` (anywhere)      -- fits the calibration (``calibration.fit.fit_run``), predicts each measured point with
                             ``advisor.costmodel.predict`` (acceptance given as the synthetic per-position rates,
                             the drafting fraction as calibrated), and writes the table and summary.

Usage on the device (after scripts/gpu-setup.sh): ``python -m benchmarks.gpu_closed_loop calibrate --workdir W``;
``python -m benchmarks.gpu_closed_loop measure --workdir W``; here: ``python -m benchmarks.gpu_closed_loop analyze
--workdir benchmarks/data/h200``.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "advisor" / "data"
TARGET = "llama-3.1-8b-instruct"
DRAFT = "llama-3.2-1b-instruct"
GPU = "H200-SXM"  # where the loop ran first; a run's own GPU is read from its files (run_gpu)
BATCH_SIZES = (1, 4, 16, 64, 128, 256)
PROMPT_TOKENS = 128
OUTPUT_TOKENS = 128
ACCEPTANCES = (0.5, 0.8)  # conditional per-position rates, pinned by vLLM's synthetic rejection sampler
CALIBRATION_ACCEPTANCE = 0.7


@dataclass(frozen=True)
class EngineCase:
    """One engine: a baseline, or a (method, k) whose synthetic acceptance is set in turn to each of
    ``acceptances`` (the rejection sampler's rate tensor is rewritten in place between them:
    :func:`set_synthetic_rates`; an engine start costs ~80 s on the H200, a rate change nothing)."""

    label: str
    method: str | None  # None: baseline
    k: int = 0
    acceptances: tuple[float, ...] = ()
    dynamic: bool = False  # with a num_speculative_tokens_per_batch_size table of k at every batch size (vLLM's
    # dynamic speculative decoding: the same k, through the engine path such a table takes)


MODEL_DRAFTER_METHODS = {"causal_lm": "draft_model", "eagle_head": "eagle", "eagle3_head": "eagle3"}


def drafter_method(name: str) -> str:
    """vLLM's speculative method for a catalog drafter: a causal LM runs as a separate draft model, a head by its
    kind (an EAGLE head: ``eagle``)."""
    return MODEL_DRAFTER_METHODS[catalog_row(name)["kind"]]


def engine_cases(drafter: str = DRAFT, dynamic_ks: tuple[int, ...] = ()) -> list[EngineCase]:
    """The measured engines; ``dynamic_ks``: the model drafter also at these k with a dynamic table (``-dynamic``)."""
    cases = [EngineCase("baseline", None)]
    model = drafter_method(drafter)
    for method, ks in ((model, (3, 5)), ("ngram", (3,))):
        for k in ks:
            cases.append(EngineCase(f"{method}-k{k}", method, k, ACCEPTANCES))
    return cases + [EngineCase(f"{model}-k{k}-dynamic", model, k, ACCEPTANCES, dynamic=True) for k in dynamic_ks]


def set_synthetic_rates(worker, conditional: list[float]) -> bool:
    """Worker side (``LLM.collective_rpc``): pin new conditional per-position acceptance rates in the rejection
    sampler of vLLM 0.24's model runner (``RejectionSampler.synthetic_conditional_rates``)."""
    import torch

    rates = worker.model_runner.rejection_sampler.synthetic_conditional_rates
    rates.copy_(torch.tensor(conditional, dtype=rates.dtype, device=rates.device))
    return True


@functools.lru_cache(maxsize=1)
def _catalog_rows() -> tuple[dict, ...]:
    return tuple(json.loads((DATA_DIR / "models.json").read_text())["items"])


def catalog_row(name: str) -> dict:
    """The packaged catalog's row of ``name``; ``NAME@L`` is that model's shape cut or stretched to ``L`` decoder
    layers (every layer alike), for timing how a drafter's cost grows with its depth at one width
    (``benchmarks/draft_host.py --drafters``)."""
    base, _, layers = name.partition("@")
    row = dict(next(r for r in _catalog_rows() if r["name"] == base))
    if layers:
        row.update(name=name, num_layers=int(layers))
    return row


@functools.lru_cache(maxsize=1)
def _gpu_rows() -> tuple[dict, ...]:
    return tuple(json.loads((DATA_DIR / "gpus.json").read_text())["items"])


def catalog_specs(drafter: str = DRAFT, gpu_name: str = GPU, target: str = TARGET):
    """(the catalog GPU ``gpu_name``, target, drafter) as the cost model's specs, from the packaged catalog."""
    from advisor.costmodel import GpuSpec, ModelSpec

    gpu = next(g for g in _gpu_rows() if g["name"] == gpu_name)
    return GpuSpec.from_dict(gpu), ModelSpec.from_dict(catalog_row(target)), ModelSpec.from_dict(catalog_row(drafter))


def catalog_gpu(detected: str | None) -> str:
    """The packaged catalog's name of a detected GPU (``NVIDIA H100 80GB HBM3`` -> ``H100-SXM``), matched as the
    product checks a run's ``--hardware`` (``calibration.runner.hardware_mismatch``); H200-SXM for runs that kept
    no GPU name (every such stored run was on the H200)."""
    from calibration.runner import hardware_mismatch

    if not detected:
        return GPU
    for g in _gpu_rows():
        if g["gpu_class"] != "cpu" and hardware_mismatch(g["name"], {"gpu_name": detected}) is None:
            return g["name"]
    raise ValueError(f"no catalog GPU matches {detected!r}")


def run_gpu(workdir: Path) -> str:
    """The catalog GPU a run measured on: its measurements' GPU, else its calibration's."""
    rows = load_jsonl(workdir / "measurements.jsonl")
    detected = next((r.get("gpu_name") for r in rows if r.get("gpu_name")), None)
    info = workdir / "calibration-run.json"
    if detected is None and info.exists():
        detected = json.loads(info.read_text()).get("environment", {}).get("gpu_name")
    return catalog_gpu(detected)


def shapes(workdir: Path, drafter: str = DRAFT, target: str = TARGET) -> tuple[str, str]:
    """Config-only checkpoints of the target's and the drafter's shapes (the drafter's directory is its catalog
    name: :func:`run_drafter` reads it back from the records)."""
    from calibration.models import write_shape

    return (str(write_shape(catalog_row(target), workdir / "shapes" / target)),
            str(write_shape(catalog_row(drafter), workdir / "shapes" / drafter.replace("@", "-layers"))))


def run_drafter(records: list[dict]) -> str:
    """The catalog name of the model drafter a run timed (its shape directory's name), or the default one."""
    return _model_drafter([r["params"]["engine"].get("speculative_config") for r in records]) or DRAFT


def _model_drafter(speculative_configs: list[dict | None]) -> str | None:
    for spec in speculative_configs:
        if (spec or {}).get("method") in MODEL_DRAFTER_METHODS.values() and spec.get("model"):
            return Path(spec["model"]).name
    return None


def measured_models(rows: list[dict], records: list[dict]) -> tuple[str, str]:
    """(target, model drafter) of a measurement: its rows' (``target``, kept since 2026-12-05; the drafter's shape
    directory), else the calibration's (every earlier measurement timed the calibration's models)."""
    target = next((r["target"] for r in rows if r.get("target")), TARGET)
    return target, _model_drafter([r.get("speculative_config") for r in rows]) or run_drafter(records)


def gpu_probe_config(target: str, draft: str, tensor_parallel_size: int = 1, drafter: str = DRAFT,
                     second_cycle_k: int | None = None, **overrides):
    """The GPU probe plan of the closed loop: the product's ``ProbeConfig`` with timing settings for an H200;
    ``draft`` is the path of ``drafter``'s shape; ``second_cycle_k``: the drafter's cycles also at that k (one more
    engine); ``overrides``: other ``ProbeConfig`` fields (a variant of the plan, e.g. ``cycle_decode_tokens``)."""
    from calibration.probes import DrafterSpec, ProbeConfig

    return dataclasses.replace(ProbeConfig(
        model=target, probes=("memory", "timing"), load_format="dummy", skip_tokenizer_init=True,
        tensor_parallel_size=tensor_parallel_size,
        batch_sizes=(1, 8, 64, 256), cycle_batch_sizes=(1, 16, 64, 256), decode_tokens=32,
        context_len=PROMPT_TOKENS, verify_ks=(3, 5), prompt_lengths=(512, 2048, 8192), prefill_batch_sizes=(1, 4),
        max_prefill_tokens=8192, sampled_temperature=0.8, synthetic_acceptance=CALIBRATION_ACCEPTANCE,
        second_cycle_k=second_cycle_k, long_context_len=8192,
        repeats=2, max_repeats=4, max_relative_spread=0.1, max_model_len=8192 + 512,
        drafters=(DrafterSpec(drafter_method(drafter), 3, model=draft, draft_sample_method=None,
                              label=f"{drafter_method(drafter)}-{drafter}-k3"),
                  DrafterSpec("ngram", 3)),
    ), **overrides)


# --------------------------------------------------------------------------------------------- calibrate
def calibrate(workdir: Path, engines: list[str] | None = None, tp: int = 1, drafter: str = DRAFT,
              second_cycle_k: int | None = None, **overrides) -> int:
    from calibration.probes import ProbeRunError, environment_info, run_probes
    from calibration.runner import to_record

    target, draft = shapes(workdir, drafter)
    out = workdir / ("calibration.jsonl" if engines is None else "calibration-redo.jsonl")
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    splits: dict[str, float] = {}
    last = [time.perf_counter()]

    def progress(done: int, total: int, msg: str) -> None:
        now = time.perf_counter()
        key = "engine start" if "started in" in msg else "probes"
        splits[key] = splits.get(key, 0.0) + (now - last[0])
        last[0] = now
        print(f"[calibrate {done}/{total} +{now - t0:.1f}s] {msg}", file=sys.stderr, flush=True)

    with out.open("w") as f:
        def emit(m) -> None:
            f.write(json.dumps(to_record(m)) + "\n")
            f.flush()

        status = "succeeded"
        try:
            run_probes(gpu_probe_config(target, draft, tp, drafter, second_cycle_k, **overrides),
                       progress=progress, on_measurement=emit, engines=engines)
        except ProbeRunError as exc:
            status = f"failed: {exc}"
    info = {"status": status, "wall_s": round(time.perf_counter() - t0, 1),
            "split_s": {k: round(v, 1) for k, v in splits.items()}, "environment": environment_info(),
            "config": dataclasses.asdict(gpu_probe_config(target, draft, tp, drafter, second_cycle_k, **overrides))}
    (workdir / ("calibration-run.json" if engines is None else "calibration-redo-run.json")).write_text(json.dumps(info, indent=1, default=str) + "\n")
    print(json.dumps({k: info[k] for k in ("status", "wall_s", "split_s")}), flush=True)
    return 0 if status == "succeeded" else 1


# --------------------------------------------------------------------------------------------- measure
def measure_config(target: str, draft: str, tp: int = 1, quantization: str | None = None,
                   prompt_tokens: int = PROMPT_TOKENS, batch_sizes: tuple[int, ...] = BATCH_SIZES):
    """The engine settings of the measurement's engines: the plan's GPU settings, with a KV cache that holds every
    batch size's prompts, outputs and drafts (``OUTPUT_TOKENS`` generated)."""
    from calibration.probes import default_kv_cache_gib

    cfg = gpu_probe_config(target, draft, tp, quantization=quantization).resolved(on_gpu=True)
    if prompt_tokens != PROMPT_TOKENS:  # long prompts: the largest batch's cache, with 15 % to spare (engines that
        # start together share the GPU, and the plan's 50 % would not let two 8B engines hold B = 64 at 4k)
        cfg = dataclasses.replace(cfg, context_len=prompt_tokens, max_num_seqs=max(batch_sizes),
                                  decode_tokens=OUTPUT_TOKENS, long_context_len=None)
        return dataclasses.replace(cfg, kv_cache_memory_gib=default_kv_cache_gib(cfg, spare=1.15))
    return dataclasses.replace(cfg, decode_tokens=OUTPUT_TOKENS)


def case_speculative_config(case: EngineCase, target: str, draft: str) -> dict | None:
    """vLLM's ``speculative_config`` of a measured engine, at its first synthetic acceptance (None: the baseline)."""
    from calibration.probes import DrafterSpec, synthetic_rates

    if not case.method:
        return None
    d = DrafterSpec(case.method, case.k, model=None if case.method == "ngram" else draft, draft_sample_method=None)
    spec = d.speculative_config(target, synthetic_rates(case.acceptances[0], case.k))
    if case.dynamic:  # the table form an answer's serve flags carry (advisor.costmodel.vllm_config), one band
        spec["num_speculative_tokens_per_batch_size"] = [[1, 512, case.k]]
    return spec


def measure_groups(cases: list[EngineCase], cfg, target: str, draft: str,  # noqa: ANN001
                   gpu_memory: int | None) -> list[list[EngineCase]]:
    """The measured engines that start together: all of them where their memory estimates
    (``calibration.probes.engine_memory_estimate_bytes``) fit in the GPU's whole memory, as the four engines of every
    H200 lease ran (136 of 140 GiB estimated, ~132 held); else as the probe plan groups its engines
    (``calibration.probes.start_groups``: as many as fit in 90 % of it), on an 80 GB H100 two and two."""
    from calibration.probes import EnginePlan, engine_memory_estimate_bytes, held_engine_config, start_groups

    items = [EnginePlan(c.label, target, case_speculative_config(c, target, draft)) for c in cases]
    by_label = {c.label: c for c in cases}
    need = sum(engine_memory_estimate_bytes(item, held_engine_config(cfg, 1)) for item in items)
    if not items or not gpu_memory or need <= gpu_memory:
        return [list(cases)] if cases else []
    return [[by_label[item.label] for item in group] for group in start_groups(items, cfg, gpu_memory)]


STEADY_ROUNDS = 4  # requests per slot in a steady-state run, plus STEADY_EXTRA: its reading leaves out the first B
STEADY_EXTRA = 4  # and the last B requests sent (the start together and the end's drain), 2B + 4 remain


def steady_requests(batch: int) -> int:
    return STEADY_ROUNDS * batch + STEADY_EXTRA


def steady_state(llm, batch: int, prompts: Callable[[int], list], params, requests: int) -> dict:  # noqa: ANN001
    """``batch`` requests in flight on vLLM's offline ``LLM`` (``enqueue``; its outputs are final only), each one that
    finishes replaced at once by the next until ``requests`` were sent: a server at concurrency B, whose requests
    desynchronise and whose new prompts ride in the others' decode steps. Each finished request's front-end finish
    time (seconds since the start) and its engine-clock decode span (first to last token:
    :func:`calibration.probes.engine_decode_spans_s`), with vLLM's counters over the run."""
    from calibration.probes import engine_decode_spans_s, read_spec_counters

    engine = llm.llm_engine
    sent: dict[str, tuple[int, float]] = {}
    t0 = time.perf_counter()

    def send(n: int) -> None:
        n = min(n, requests - len(sent))
        if n > 0:
            now = time.perf_counter() - t0
            # (vLLM >= 0.24 returns its internal id: the front end's counter, "-", a random suffix)
            for rid in llm.enqueue(prompts(n), params, use_tqdm=False):
                sent[str(rid).split("-")[0]] = (len(sent), now)

    c0 = read_spec_counters(llm)
    send(batch)
    done: list[dict] = []
    while engine.has_unfinished_requests():
        finished = [o for o in engine.step() if o.finished]
        now = time.perf_counter() - t0
        for o in finished:
            index, at = sent.get(str(o.request_id).split("-")[0], (None, None))
            span = engine_decode_spans_s([o])
            done.append({"index": index, "sent_s": None if at is None else round(at, 6), "done_s": round(now, 6),
                         "output_tokens": len(o.outputs[0].token_ids),
                         "decode_span_s": round(span[0], 6) if span else None})
        send(len(finished))
    d = read_spec_counters(llm) - c0
    return {"wall_s": round(time.perf_counter() - t0, 6), "requests": done, "num_drafts": d.num_drafts,
            "num_draft_tokens": d.num_draft_tokens, "num_accepted_tokens": d.num_accepted_tokens,
            "engine_steps": d.engine_steps, "iteration_tokens": d.iteration_tokens}


def _measure_engine(case: EngineCase, target: str, draft: str, out: Path, tp: int = 1, held: int = 0,
                    quantization: str | None = None, prompt_tokens: int = PROMPT_TOKENS,
                    batch_sizes: tuple[int, ...] = BATCH_SIZES, steady: bool = False) -> None:
    """Child process: one engine, every batch size; one JSON line per batch size to ``out`` (``steady``: a
    :func:`steady_state` run and one batch that starts together, instead of the timed batches). ``held`` > 0: one of
    that many engines starting together; report ``ready`` once started and warmed up, then wait for ``go``.
    ``quantization``: the target's vLLM quantization (e.g. "fp8"; a drafter stays bf16, as vLLM loads it).
    ``prompt_tokens``: the prompts' length (a long one puts the KV read into every step)."""
    from calibration.probes import (_random_prompts, _sampling, engine_decode_spans_s, environment_info,
                                    event_stream, held_engine_config, read_spec_counters, start_engine, stop_engine)

    import random

    events = event_stream() if held else None
    cfg = measure_config(target, draft, tp, quantization, prompt_tokens, batch_sizes)
    if held:  # the KV cache holds every batch size's prompts, outputs and drafts
        cfg = held_engine_config(cfg, held)
    settings = cfg.engine_settings(target)
    spec = case_speculative_config(case, target, draft)
    acceptances: tuple[float | None, ...] = case.acceptances if case.method else (None,)
    llm, startup = start_engine(settings, spec)
    rng = random.Random(7)
    copy = case.method == "ngram"  # n-gram drafts only where the prompt repeats itself

    def prompts(n: int) -> list:
        return _random_prompts(n, prompt_tokens, rng, repetitive=copy)

    one, many = _sampling(0.0, 1, 0, False), _sampling(0.0, OUTPUT_TOKENS, 0, False)
    env = environment_info()
    try:
        llm.generate(prompts(8), many, use_tqdm=False)
        if held:
            from calibration.probes import wait_for_go

            wait_for_go(case.label, events)
        with out.open("a") as f:
            for i, acc in enumerate(acceptances):
                label = case.label if acc is None else f"{case.label}-a{acc:g}"
                if i > 0:
                    try:
                        llm.collective_rpc(set_synthetic_rates, args=([acc] * case.k,))
                    except Exception as exc:  # keep the other measurements
                        print(f"[{label}] cannot change the synthetic rates: {exc!r}", file=sys.stderr, flush=True)
                        break
                for b in batch_sizes:
                    llm.generate(prompts(b), many, use_tqdm=False)
                    row = {"engine": label, "target": Path(target).name, "method": case.method, "k": case.k,
                           "acceptance": acc,
                           "tensor_parallel_size": tp, "quantization": quantization,
                           "batch_size": b, "prompt_tokens": prompt_tokens, "output_tokens": OUTPUT_TOKENS,
                           "startup_s": startup, "speculative_config": spec,
                           "gpu_name": env.get("gpu_name"), "vllm_version": env.get("vllm_version")}
                    if steady:
                        row.update(_steady_row(llm, label, b, prompts, many))
                    else:
                        rounds = []
                        for _ in range(2):
                            t0 = time.perf_counter()
                            llm.generate(prompts(b), one, use_tqdm=False)
                            t1 = time.perf_counter() - t0
                            c0 = read_spec_counters(llm)
                            t0 = time.perf_counter()
                            outs = llm.generate(prompts(b), many, use_tqdm=False)
                            tn = time.perf_counter() - t0
                            d = read_spec_counters(llm) - c0
                            spans = engine_decode_spans_s(outs)  # each request's own decode time; the batch's
                            # wall time is its slowest request's (a speculative batch drains: its sequences finish
                            # apart)
                            rounds.append({"first_token_s": t1, "wall_s": tn,
                                           "decode_spans_s": [round(x, 6) for x in spans] if spans else None,
                                           "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                                           "num_drafts": d.num_drafts, "num_draft_tokens": d.num_draft_tokens,
                                           "num_accepted_tokens": d.num_accepted_tokens,
                                           "accepted_per_pos": d.accepted_per_pos, "engine_steps": d.engine_steps,
                                           "iteration_tokens": d.iteration_tokens})
                        row["rounds"] = rounds
                        dec = statistics.median(r["wall_s"] - r["first_token_s"] for r in rounds)
                        print(f"[{label}] B={b}: decode {dec:.3f} s", file=sys.stderr, flush=True)
                    f.write(json.dumps(row, default=str) + "\n")
                    f.flush()
    finally:
        stop_engine(llm)


def _steady_row(llm, label: str, b: int, prompts: Callable[[int], list], params) -> dict:  # noqa: ANN001
    """One batch size of a ``--steady`` measurement: :func:`steady_state`, then one batch of B that starts together
    on the same engine (its wall time, each request's decode span and vLLM's counters)."""
    from calibration.probes import engine_decode_spans_s, read_spec_counters

    run = steady_state(llm, b, prompts, params, steady_requests(b))
    c0 = read_spec_counters(llm)
    t0 = time.perf_counter()
    outs = llm.generate(prompts(b), params, use_tqdm=False)
    wall = time.perf_counter() - t0
    d = read_spec_counters(llm) - c0
    spans = engine_decode_spans_s(outs)
    batch = {"wall_s": round(wall, 6), "decode_spans_s": [round(x, 6) for x in spans] if spans else None,
             "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs), "num_drafts": d.num_drafts,
             "num_accepted_tokens": d.num_accepted_tokens, "engine_steps": d.engine_steps}
    print(f"[{label}] B={b}: steady {len(run['requests'])} requests in {run['wall_s']:.2f} s, batch {wall:.3f} s",
          file=sys.stderr, flush=True)
    return {"steady": run, "batch": batch}


def measure(workdir: Path, only: list[str] | None = None, tp: int = 1, drafter: str = DRAFT,
            quantization: str | None = None, prompt_tokens: int = PROMPT_TOKENS,
            batch_sizes: tuple[int, ...] = BATCH_SIZES, target_name: str = TARGET,
            dynamic_ks: tuple[int, ...] = (), steady: bool = False) -> int:
    """Measure every engine case not yet measured in ``workdir``: the engines start together (each in its own
    process, as :func:`calibration.probes.run_probes` does on a GPU), then measure one at a time. ``target_name``:
    the catalog target whose shape is served (another than the calibration's: priced by a profile, not by it).
    ``steady``: steady-state runs (:func:`_steady_row`) into ``steady.jsonl``."""
    from calibration.probes import HeldProcess, gpu_memory_bytes

    out = workdir / ("steady.jsonl" if steady else "measurements.jsonl")
    done = set()
    if out.exists():
        rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        by: dict[str, set] = {}
        for r in rows:
            by.setdefault(r["engine"], set()).add(r["batch_size"])
        done = {c.label for c in engine_cases(drafter, dynamic_ks)
                if all(by.get(lbl, set()) >= set(batch_sizes)
                       for lbl in ([c.label] if not c.method else [f"{c.label}-a{a:g}" for a in c.acceptances]))}
    todo = [c for c in engine_cases(drafter, dynamic_ks) if c.label not in done and not (only and c.label not in only)]
    target, draft = shapes(workdir, drafter, target_name)
    cfg = measure_config(target, draft, tp, quantization, prompt_tokens, batch_sizes)
    status = 0
    for group in measure_groups(todo, cfg, target, draft, gpu_memory_bytes()):
        t0 = time.perf_counter()
        procs = [HeldProcess([sys.executable, "-m", "benchmarks.gpu_closed_loop", "_engine", "--workdir",
                              str(workdir), "--case", json.dumps(dataclasses.asdict(c)), "--tp", str(tp),
                              "--held", str(len(group)), "--drafter", drafter, "--target", target_name,
                              "--prompt-tokens", str(prompt_tokens),
                              "--batch-sizes", ",".join(map(str, batch_sizes))]
                             + (["--quantization", quantization] if quantization else [])
                             + (["--steady"] if steady else []), c.label) for c in group]
        try:
            ready = [p.wait_ready() for p in procs]
            print(f"[measure] {sum(ready)}/{len(procs)} engines started in {time.perf_counter() - t0:.0f} s",
                  flush=True)
            for p, ok in zip(procs, ready):
                t1 = time.perf_counter()
                rc = p.run() if ok else p.proc.wait()
                print(f"[measure] {p.label}: exit {rc} in {time.perf_counter() - t1:.0f} s", flush=True)
                status = status or rc
        finally:
            for p in procs:
                p.kill()
    return status


# --------------------------------------------------------------------------------------------- analyze
@dataclass
class Point:
    engine: str
    method: str
    k: int
    acceptance: float
    batch_size: int
    measured: float  # end-to-end speedup of the batch: baseline wall time / speculative wall time (O tokens each)
    predicted: float
    low: float
    high: float
    drafted_fraction: float
    realised_al: float | None
    extra: dict = field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def drafted_share(num_drafts: float, num_accepted: float, output_tokens: float, requests: int) -> float | None:
    """Share of sequence-steps that drafted, from vLLM's counters: each request's first token comes from its
    prefill, and a sequence-step yields 1 + its accepted drafts (None: no step after the first tokens)."""
    steps = output_tokens - requests - num_accepted
    return min(1.0, num_drafts / steps) if steps > 0 else None


def realised_al(num_drafts: float, num_accepted: float) -> float | None:
    """Tokens per drafting step, 1 + accepted drafts per draft (vLLM's counters)."""
    return 1.0 + num_accepted / num_drafts if num_drafts else None


def _decode_s(row: dict) -> float:
    return statistics.median(r["wall_s"] - r["first_token_s"] for r in row["rounds"])


def _request_decode_s(row: dict) -> float | None:
    """Median over rounds of the mean request decode span (None for runs that did not record spans)."""
    means = [statistics.fmean(r["decode_spans_s"]) for r in row["rounds"] if r.get("decode_spans_s")]
    return statistics.median(means) if len(means) == len(row["rounds"]) else None


def _wall_s(row: dict) -> float:
    return statistics.median(r["wall_s"] for r in row["rounds"])


def load_jsonl(path: Path) -> list[dict]:
    """JSON lines of ``path``, else of its gzipped copy ``path.gz`` (how large files are stored), else none."""
    import gzip

    gz = path.with_name(path.name + ".gz")
    text = path.read_text() if path.exists() else gzip.decompress(gz.read_bytes()).decode() if gz.exists() else ""
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def calibration_records(workdir: Path) -> list[dict]:
    """The run's records; engines redone later (``calibrate --only``) replace the first run's records of them."""
    records = load_jsonl(workdir / "calibration.jsonl")
    redo = load_jsonl(workdir / "calibration-redo.jsonl")
    redone = {r["params"]["engine"].get("label") for r in redo}
    return [r for r in records if not redone or r["params"]["engine"].get("label") not in redone] + redo


# vLLM 0.24's scheduler setting per speculative method, as its start-up log states it (the EAGLE run's
# calibrate.err.gz: "Using V2 Model Runner" and "Asynchronous scheduling is enabled" for the plain and the EAGLE
# engine; "using the V1 model runner" with it disabled for custom_class and ngram, and for a draft model
# (shared/gpu/README.md)): for records taken before the memory probe kept ``async_scheduling``
ASYNC_SCHEDULING_0_24 = {None: True, "eagle": True, "eagle3": True, "draft_model": False, "ngram": False,
                         "custom_class": False}


def with_engine_paths(records: list[dict]) -> list[dict]:
    """``records`` with each memory record's ``async_scheduling``, from vLLM 0.24's behaviour where not recorded."""
    out = []
    for r in records:
        if r["probe"] == "memory" and r["values"].get("async_scheduling") is None:
            method = (r["params"]["engine"].get("speculative_config") or {}).get("method")
            r = {**r, "values": {**r["values"], "async_scheduling": ASYNC_SCHEDULING_0_24.get(method)}}
        out.append(r)
    return out


def build_gpu_calibration(records: list[dict], gpu, target, draft, run_id: int = 0):
    """Fit the GPU run (``calibration.fit.fit_run``): one set of step-time parameters for the target and its
    drafter's forwards (target decode, verify widths, speculative steps without drafts, whole draft-model and
    n-gram cycles), and the prefill fit; keyed by what was measured (the weights dtype, TP, CUDA graphs), with the
    weights dtype read as the product's jobs read it (``calibration.fit.run_weights_dtype``). A drafter whose engine
    ran another path than the verify probes (an EAGLE head, with async scheduling) gets a fit of its own engine's
    probes and the target's plain steps (``calibration.fit.engine_path_records``)."""
    from advisor.costmodel import Calibration
    from calibration.fit import fit_run, run_weights_dtype

    records = with_engine_paths(records)
    target_path, models = fit_models(records, draft)
    results: dict = {}
    dtype = run_weights_dtype(records)
    fits = fit_run(records, gpu, target, draft, drafter_method(draft.name), draft.name, dtype,
                   target_path=target_path, models=models, results=results)
    by_kind: dict[str, dict] = {"step_time": {}, "prefill": {}, "acceptance": {}}
    for f in fits:
        by_kind[f["kind"]][f["key"]] = f["params"]
    batches = [r["values"]["batch_size"] for r in records if r["probe"] == "step_time"]
    cal = Calibration.from_dict({"run_id": run_id, "hardware": gpu.name, **by_kind,
                                 "max_batch_calibrated": max(batches), "temperature_range": [0.0, 0.8],
                                 "weights_dtype": dtype, "tensor_parallel_size": tensor_parallel_size(records),
                                 "engine_mode": "graphs", "drafter_methods": {draft.name: drafter_method(draft.name)}})
    return cal, results


def fit_models(records: list[dict], draft) -> tuple[str | None, dict]:
    """The target engine's checkpoint path (None where no target engine ran: every other path is the target's),
    and the model drafter's path(s) -> ``draft`` (joined into the joint fit)."""
    engines = [r["params"]["engine"] for r in records]
    target_path = next((e["model"] for e in engines if e.get("label") == "target"), None)
    draft_paths = {(e.get("speculative_config") or {}).get("model") for e in engines
                   if (e.get("speculative_config") or {}).get("method") in MODEL_DRAFTER_METHODS.values()}
    return target_path, {p: draft for p in draft_paths if p}


def tensor_parallel_size(records: list[dict]) -> int:
    return max(int(r["params"]["engine"].get("tensor_parallel_size") or 1) for r in records)


def measurement_rows(workdir: Path, name: str = "measurements.jsonl") -> list[dict]:
    """The measured rows (``name``: ``steady.jsonl`` for ``measure --steady``); a (engine, batch size) measured again
    (an engine case redone after a time limit stopped it) keeps its last row."""
    rows = {(r["engine"], r["batch_size"]): r for r in load_jsonl(workdir / name)}
    return list(rows.values())


def analyze(workdir: Path, out_json: Path | None = None, calibration_dir: Path | None = None,
            remeasured: tuple[Path, ...] = (), profile: bool = False, pooled_with: tuple[Path, ...] = (),
            uncalibrated: bool = False, calibrated_profile: bool = False) -> int:
    """Predict ``workdir``'s measurements from the calibration in ``calibration_dir`` (default: the same run); with
    ``pooled_with`` (earlier calibrations of the same conditions), from its fit with their timing records, as a
    product run's fit pools its earlier runs' (:func:`calibration.fit.pool_runs`); with ``remeasured`` (later
    measurements of the same engines), against their pooled speedups (``pool_measurements``); with ``profile``,
    from the engine profile the product prices the run's GPU × vLLM 0.24 by (:func:`shipped_profile`: its own or
    one carried to it) instead of any calibration (the answer a scenario naming that vLLM version gets before its
    user calibrates); with ``calibrated_profile``, from the calibration and that profile together (the answer after
    its user calibrated: the profile times a drafter of a method the run did not); with ``uncalibrated``, from
    neither (the catalog's defaults: the answer without a version, before its user calibrates)."""
    from calibration.fit import POOLED_PROBES, pool_runs

    records = pool_runs([calibration_records(d) for d in (calibration_dir or workdir, *pooled_with)], POOLED_PROBES)
    gpu = run_gpu(workdir)
    points, results = predict_measurements(workdir, records,
                                           shipped_profile(gpu=gpu) if profile or calibrated_profile else None,
                                           uncalibrated=uncalibrated, with_calibration=calibrated_profile)
    if remeasured:
        points = pool_measurements(points, [measured_speedups(d) for d in remeasured])
    step_fit = results[f"step_time:{TARGET}"]
    print(f"step-time fit: rms relative residual {step_fit.rmse_rel:.3f}; free {', '.join(step_fit.free)}")
    for row in step_fit.points:
        print(f"  {row['kind']:6} B={row['batch']:3} q={row['q']} T={row['temperature']:g} measured "
              f"{1e3 * row['measured_s']:.2f} ms predicted {1e3 * row['predicted_s']:.2f} ms")
    summary = summarise(points)
    mixed = mixed_steps(records, results, gpu)
    if mixed:
        summary["mixed_steps"] = mixed
    print(format_table(points))
    print(json.dumps(summary, indent=1))
    if out_json:
        out_json.write_text(json.dumps({"summary": summary, "points": [dataclasses.asdict(p) | {"error": p.error}
                                                                       for p in points]}, indent=1) + "\n")
    return 0


def mixed_steps(records: list[dict], results: dict, gpu_name: str = GPU) -> list[dict]:
    """The plan's mixed-width verify steps (``ProbeConfig.mixed_width_batch_sizes``: half the batch drafts k, half
    nothing) against what the cost model charges such a batch, a uniform verify of the same mean width
    (``evaluate_grid``: q = 1 + f·k) priced by the run's own step fit, and against the same engine's uniform steps
    at q = 1 and q = k + 1 (each measured, at the same B)."""
    from calibration.fit import StepPoint, predict_points, run_weights_dtype

    gpu, target, _ = catalog_specs(run_drafter(records), gpu_name)
    params = results[f"step_time:{TARGET}"].params
    uniform = {(r["params"]["engine"]["label"], r["values"]["batch_size"], r["values"]["q"]): r["values"]["step_s"]
               for r in records if r["probe"] == "step_time" and r["values"].get("kind", "step") == "step"
               and not r["values"].get("temperature")}
    out = []
    for r in records:
        v = r["values"]
        if r["probe"] != "step_time" or v.get("kind") != "mixed":
            continue
        label, b, q = r["params"]["engine"]["label"], v["batch_size"], v["q"]
        per_seq_steps = max(1.0, b * v["steps"] * max(1, len(v.get("step_s_samples") or [1])))
        width = v["num_draft_tokens"] / per_seq_steps  # mean drafts per sequence per step (half of q - 1)
        ctx = v["context_len"] + 1.0 + v["steps"] / 2.0
        point = StepPoint("step", target, None, float(b), 1.0 + width, int(q - 1), ctx, v["step_s"])
        priced = float(predict_points([point], gpu, params, run_weights_dtype(records))[0])
        out.append({"batch": b, "k": q - 1, "mean_width": round(width, 3), "measured_ms": round(1e3 * v["step_s"], 3),
                    "priced_ms": round(1e3 * priced, 3), "error": round(priced / v["step_s"] - 1.0, 4),
                    "uniform_q1_ms": _ms(uniform.get((label, b, 1))),
                    "uniform_full_ms": _ms(uniform.get((label, b, q)))})
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1e3 * seconds, 3)


def measured_speedups(workdir: Path) -> dict[tuple[str, int], float]:
    """(engine, B) -> the measured end-to-end speedup of ``workdir``'s measurement (batch wall time, as ``Point``)."""
    rows = measurement_rows(workdir)
    base = {r["batch_size"]: _wall_s(r) for r in rows if r["engine"] == "baseline"}
    return {(r["engine"], r["batch_size"]): base[r["batch_size"]] / _wall_s(r) for r in rows
            if r["engine"] != "baseline" and r["batch_size"] in base}


def pool_measurements(points: list[Point], repeats: list[dict[tuple[str, int], float]]) -> list[Point]:
    """``points`` measured again: each point's measured speedup becomes the geometric mean over its measurements
    (the speedup is a ratio of times), the single ones kept under ``extra['measured_each']``. On one lease two
    measurements minutes apart differ by a median 15 % (run 10), so one measurement is a noisy truth."""
    out = []
    for p in points:
        each = [p.measured] + [r[p.engine, p.batch_size] for r in repeats if (p.engine, p.batch_size) in r]
        pooled = math.exp(statistics.fmean(math.log(m) for m in each))
        out.append(dataclasses.replace(p, measured=pooled, extra={**p.extra, "measured_each": each}))
    return out


def measured_weights_dtype(row: dict) -> str:
    """The target's weights dtype in a measured row (its ``quantization``; rows before it was kept are bf16). An
    answer for it is priced at that dtype, whatever the calibration's: a bf16 calibration then prices fp8 weights as
    the shipped profile does (the cost model's bytes and FLOPs at fp8, the fitted efficiencies and overheads)."""
    from advisor.costmodel.memory import engine_weights_dtype

    return engine_weights_dtype({"quantization": row.get("quantization")}) or "bf16"


def shipped_profile(vllm_version: str = "0.24", gpu: str = GPU):
    """The engine profile the product prices ``gpu`` × ``vllm_version`` by (``advisor/data/engine_profiles.json``):
    that GPU's own, else one of that version carried to it (``advisor.services.catalog.engine_profile_for``)."""
    from advisor.costmodel import GpuSpec
    from advisor.services.catalog import engine_profile_for

    profile = engine_profile_for(GpuSpec.from_dict(next(g for g in _gpu_rows() if g["name"] == gpu)), vllm_version)
    if profile is None:
        raise LookupError(f"no engine profile prices {gpu} x vLLM {vllm_version}")
    return profile


def predict_measurements(workdir: Path, records: list[dict], profile=None,  # noqa: ANN001
                         adjust: Callable[[Any], Any] | None = None,
                         uncalibrated: bool = False, with_calibration: bool = False) -> tuple[list[Point], dict]:
    """``workdir``'s measured points, each with the speedup ``predict`` gives from the calibration ``records``, or
    with ``profile`` (a ``MeasuredEngineProfile``) from that profile and no calibration (the records then give only
    n-gram's drafted fraction, a workload input), or ``uncalibrated`` from neither (the catalog's defaults); with
    ``profile`` and ``with_calibration``, from both, as a scenario naming the profile's vLLM version is priced after its
    user calibrated (the profile times a drafter of a method the calibration did not time: ``engine_steps``); and the
    fits (``fit_run``'s results). ``adjust``: the fitted
    ``Calibration`` -> the one to predict from (an experiment on the fit's output, benchmarks/calibration_tally.py)."""
    from advisor.costmodel import predict

    rows = measurement_rows(workdir)
    target_name, drafter = measured_models(rows, records)
    gpu_name = run_gpu(workdir)
    cal, results = build_gpu_calibration(records, *catalog_specs(run_drafter(records), gpu_name))
    if target_name != TARGET and (with_calibration or not (profile or uncalibrated)):
        raise ValueError(f"the calibration timed {TARGET}; a measurement of {target_name} is priced by a profile "
                         "(--profile) or the defaults (--uncalibrated)")
    gpu, target, draft = catalog_specs(drafter, gpu_name, target_name)
    if adjust is not None:
        cal = adjust(cal)
    tp = tensor_parallel_size(records)
    base = {r["batch_size"]: _decode_s(r) for r in rows if r["engine"] == "baseline"}
    measured = measured_speedups(workdir)
    base_request = {r["batch_size"]: _request_decode_s(r) for r in rows if r["engine"] == "baseline"}
    points: list[Point] = []
    for r in rows:
        if r["engine"] == "baseline" or r["batch_size"] not in base:
            continue
        rounds = r["rounds"]
        drafts = sum(x["num_drafts"] for x in rounds)
        acc = sum(x["num_accepted_tokens"] for x in rounds)
        frac = drafted_share(drafts, acc, sum(x["output_tokens"] for x in rounds), r["batch_size"] * len(rounds))
        k, a = r["k"], r["acceptance"]
        copy = r["method"] == "ngram"
        scen = point_scenario(r, gpu.name, target.name, draft.name, tp,
                              calibrated_draft_fraction(results) if copy else None)
        calibration = cal if with_calibration or not (profile or uncalibrated) else None
        ans = predict(scen, gpu, target, None if copy else draft, calibration,
                      compare_methods=False, profile=profile).to_dict()
        sp = ans["speedup"]
        extra = {"decision": ans["decision"], "break_even": ans.get("break_even_concurrency"),
                 "decode_measured": base[r["batch_size"]] / _decode_s(r), "decode_predicted": sp["decode"]}
        request = _request_decode_s(r)
        if request and base_request.get(r["batch_size"]):  # per request, not the batch's slowest
            extra["decode_per_request_measured"] = base_request[r["batch_size"]] / request
        points.append(Point(r["engine"], r["method"], k, a, r["batch_size"], measured[r["engine"], r["batch_size"]],
                            sp["expected"], sp["low"], sp["high"], frac or 0.0, realised_al(drafts, acc), extra))
    return points, results


def point_scenario(row: dict, gpu: str, target: str, draft: str, tp: int = 1, draft_fraction: float | None = None):
    """The scenario ``predict`` prices a measured row (engine method, k, synthetic acceptance, B, prompt and output
    lengths, weights dtype) by: B requests in flight (``concurrency``), the synthetic rates as the per-position
    acceptance, and ``draft_fraction`` for a copy drafter."""
    from advisor.costmodel.types import AcceptanceInput, Scenario, Speculator, Workload

    k, a = row["k"], row["acceptance"]
    copy = row["method"] == "ngram"
    return Scenario(
        gpu=gpu, target_model=target, speculator=Speculator(row["method"], None if copy else draft, k),
        workload=Workload(row["prompt_tokens"], row["output_tokens"], 0.0, "code", concurrency=row["batch_size"]),
        gpu_count=tp, weights_dtype=measured_weights_dtype(row),
        acceptance=AcceptanceInput(per_position=tuple(a ** (i + 1) for i in range(k)),
                                   draft_fraction=draft_fraction if copy else None))


PROFILES_FILE = DATA_DIR / "engine_profiles.json"
PROFILE_BEHAVIOUR = ("a separate draft model runs without CUDA graphs",
                     "async scheduling is off with draft-model and n-gram speculation")


def profile_behaviour(records: list[dict]) -> list[str]:
    """What vLLM 0.24 does differently, in words, and how far the host's cores moved in speed in the profile's runs
    (their ``host_speed`` records' p95 / p5, else as the H200 node's later leases read it), which the host-bound
    steps follow."""
    swings = sorted(r["values"]["swing"] for r in records if r["probe"] == "host_speed") or [1.7, 1.8]
    spread = f"{swings[0]:.1f}" if f"{swings[0]:.1f}" == f"{swings[-1]:.1f}" else f"{swings[0]:.1f}-{swings[-1]:.1f}"
    return [*PROFILE_BEHAVIOUR, "steps that run on the host (a draft model's, n-gram's) follow the host cores' speed, "
            f"which other tenants moved {spread}x on the node measured: read the interval"]


PROFILE_LONG_CONTEXT = Path("benchmarks/data/h200-vllm0.24-kv/kv-auto.jsonl")  # run 12: decode at 8k, bf16 KV
# Each profiled GPU's long-context decode steps (run 12 on the H200, run 20's lease on the H100), which join every
# fit a profile ships: the target's and each head's (``profile --extra-records``). A head's run times its plain
# steps at a 128-token context only, which cannot tell the HBM efficiency from the per-step overhead: the H200's
# EAGLE-3 fit read 0.65 and 0 ms without them, 0.88 and 1.2 ms with them (the target's: 0.85 and 1.0 ms).
LONG_CONTEXT_STEPS = {"H200-SXM": PROFILE_LONG_CONTEXT,
                      "H100-SXM": Path("benchmarks/data/h100-vllm0.24-kv/kv-auto.jsonl")}


def head_profile_records(workdir: Path) -> list[dict]:
    """A head's run as its profile entry is fitted: its records with its GPU's long-context decode steps
    (``profile --workdir RUN --extra-records LONG_CONTEXT_STEPS[gpu]``)."""
    return pooled_records([workdir], load_jsonl(REPO_ROOT / LONG_CONTEXT_STEPS[run_gpu(workdir)]))


# every bf16 lease with a closed loop of the draft model and n-gram, one measurement each (run 6 measured none)
BF16_LEASES = ("h200-vllm0.24", "h200-vllm0.24-run2", "h200-vllm0.24-run3", "h200-vllm0.24-run4",
               "h200-vllm0.24-run5", "h200-vllm0.24-run7", "h200-vllm0.24-run8", "h200-vllm0.24-run9",
               "h200-vllm0.24-run10", "h200-vllm0.24-run13", "h200-vllm0.24-run14",
               "h200-vllm0.24-run15", "h200-vllm0.24-run16", "h200-vllm0.24-run17", "h200-vllm0.24-run18")
# The shipped profile's fit: every calibration of the plan as it ships (cycles over 128 tokens; runs 10 and 13, two
# leases), pooled, each with run 12's long-context steps. Across the ten bf16 leases it predicts a mean 13.4 % (run 1
# alone, the profile before: 18.6 %); the cross-lease spread of the host-bound steps widens its interval.
PROFILE_POOL = tuple(Path("benchmarks/data") / n for n in (
    "h200-vllm0.24-run13", "h200-vllm0.24-run13-second", "h200-vllm0.24-run10", "h200-vllm0.24-run10-second",
    "h200-vllm0.24-run10-third"))


def pooled_records(runs: list[Path], extra: list[dict] | tuple = ()) -> list[dict]:
    """The calibration records of several runs as one run's (:func:`calibration.fit.pool_runs`, as a product run
    pools its earlier runs' timings, here with every probe). ``extra``: records whose target decode steps join each
    run's (:func:`with_target_steps`), so that they weigh in the pooled fit as in each run's own."""
    from calibration.fit import pool_runs

    return pool_runs([with_target_steps(calibration_records(run), list(extra)) if extra else calibration_records(run)
                      for run in runs])


def with_target_steps(records: list[dict], extra: list[dict]) -> list[dict]:
    """``records`` plus ``extra``'s plain decode steps of the same target shape (another run's target engine, e.g.
    run 12's long-context steps), taken as this run's target engine's. The plan's decode steps run at a 128-token
    context, where the bandwidth efficiency and the per-step overhead cannot be told apart; steps at a long context
    can (their KV read is most of the step). CUDA-graph steps of the target agree within 2-3 % across leases."""
    target = next(r for r in records if r["params"]["engine"].get("label") == "target")["params"]["engine"]
    steps = [r for r in extra if r["probe"] == "step_time" and not r["params"]["engine"].get("speculative_config")]
    return records + [{**r, "params": {**r["params"], "engine": {**target, "kv_cache_dtype":
                                                                 r["params"]["engine"].get("kv_cache_dtype", "auto")}}}
                      for r in steps]


def without_floor(step) -> dict:  # noqa: ANN001
    """A fit's parameters as a profile ships them: without the floor of steps that draft in part (``ragged_step_s``).
    Fitted on the 8B shape's engine (the H100's: 11.0 ms), a profile's floor prices SmolLM2-135M's n-gram on real
    text 58-66 % off on the H200's real-weight leases, 2-5 of 9 intervals covering and a "no-go" measured 1.01x;
    without it 19-32 %, 9 of 9, no wrong verdict (docs/gpu-closed-loop.md "Run 20"). A calibration of the user's
    own target keeps its floor."""
    return dataclasses.replace(step, ragged_step_s=0.0).to_dict()


def profile_entry(workdir: Path, vllm_version: str = "0.24", extra: tuple[Path, ...] = (),
                  pool: tuple[Path, ...] = (), old: dict | None = None) -> dict:
    """The run's fit as an engine profile of its GPU × this vLLM version, an item of
    advisor/data/engine_profiles.json (``MeasuredEngineProfile.from_dict`` reads it). A run of the default drafter
    gives the profile's timing (and its own drafter entry); a run of another drafter (an EAGLE head) adds or
    replaces only that drafter's entry in ``old``'s ``drafters``. ``extra``: record files whose target decode steps
    join the fit (:func:`with_target_steps`); ``pool``: other runs (other leases, other calibrations of one lease)
    whose records join ``workdir``'s in one fit (:func:`pooled_records`)."""
    records = pooled_records([workdir, *pool], [r for path in extra for r in load_jsonl(REPO_ROOT / path)])
    drafter = run_drafter(records)
    gpu, target, draft = catalog_specs(drafter, run_gpu(workdir))
    cal, _ = build_gpu_calibration(records, gpu, target, draft)
    env = json.loads((workdir / "calibration-run.json").read_text())["environment"]
    source = (f"benchmarks/gpu_closed_loop.py calibrate on {env.get('gpu_name')} (vLLM {env.get('vllm_version')}, "
              f"torch {env.get('torch_version')}, CUDA {env.get('cuda_version')}): {TARGET}- and {drafter}-shaped "
              f"dummy weights, bf16, CUDA graphs; records in {workdir.resolve().relative_to(REPO_ROOT)}"
              + "".join(f", {p.resolve().relative_to(REPO_ROOT)}" for p in pool)
              + "".join(f", with the target's decode steps of {p}" for p in extra))
    if drafter == DRAFT or old is None:
        profile = {
            "name": f"{gpu.name} × vLLM {vllm_version}", "gpu": gpu.name, "vllm_version": vllm_version,
            "step_time": without_floor(cal.step_time[target.name]), "prefill": cal.prefill[target.name].to_dict(),
            "max_batch_measured": cal.max_batch_calibrated, "behaviour": profile_behaviour(records), "source": source,
        }
    else:
        profile = dict(old)
    profile["drafters"] = {**(old or {}).get("drafters", {}), drafter: without_floor(cal.step_time[drafter])}
    profile["drafter_methods"] = {**(old or {}).get("drafter_methods", {}), drafter: drafter_method(drafter)}
    profile["drafter_sources"] = {**(old or {}).get("drafter_sources", {}), drafter: source}
    return profile


def write_profile(workdir: Path, vllm_version: str = "0.24", extra: tuple[Path, ...] = (),
                  pool: tuple[Path, ...] = ()) -> dict:
    """The run's fit written as the shipped engine profile of its GPU × this vLLM version
    (advisor/data/engine_profiles.json; :func:`profile_entry`), replacing that pair's."""
    data = json.loads(PROFILES_FILE.read_text()) if PROFILES_FILE.exists() else {
        "about": "Measured engine profiles: step-time and prefill fits of the product's probe plan on one GPU × vLLM "
                 "version (benchmarks/gpu_closed_loop.py). A scenario that names vllm_version gets the matching "
                 "profile's timing when no calibration run of its own applies; its drafter's own cost comes from "
                 "the profile for the drafters listed under drafters, and for another drafter of a listed one's "
                 "method (drafter_methods) from that one's fit at its own size and depth.", "items": []}
    name = f"{run_gpu(workdir)} × vLLM {vllm_version}"
    old = next((p for p in data["items"] if p["name"] == name), None)
    profile = profile_entry(workdir, vllm_version, extra, pool, old)
    data["items"] = [p for p in data["items"] if p["name"] != name] + [profile]
    PROFILES_FILE.write_text(json.dumps(data, indent=1) + "\n")
    return profile


def calibrated_draft_fraction(results: dict) -> float:
    """Share of n-gram steps that drafted in the calibration's cycle probes (on the same kind of prompts)."""
    fit = results[f"step_time:{TARGET}"]
    fr = [row for row in fit.points if row["kind"] == "cycle" and row.get("draft_fraction", 1.0) < 1.0]
    return float(np.mean([row["draft_fraction"] for row in fr])) if fr else 1.0


def summarise(points: list[Point]) -> dict:
    errs = sorted(abs(p.error) for p in points)
    signs = sum((p.predicted > 1) == (p.measured > 1) for p in points)
    cover = sum(p.low <= p.measured <= p.high for p in points)
    out = {"points": len(points), "median_abs_error": errs[len(errs) // 2] if errs else None,
           "sign_right": signs, "interval_coverage": cover / len(points) if points else None}
    per_request = [p.extra["decode_predicted"] / p.extra["decode_per_request_measured"] - 1 for p in points
                   if p.extra.get("decode_per_request_measured")]
    if per_request and len(per_request) == len(points):  # runs that recorded each request's decode span
        decode = sorted(abs(p.extra["decode_predicted"] / p.extra["decode_measured"] - 1) for p in points)
        out["decode"] = {"median_abs_error_batch": decode[len(decode) // 2],
                         "median_abs_error_per_request": sorted(map(abs, per_request))[len(per_request) // 2]}
    each = [p.extra["measured_each"] for p in points if len(p.extra.get("measured_each", ())) > 1]
    if each:  # how far one measurement moves from the next: the floor under any prediction's error
        out["measurements"] = {"runs": max(map(len, each)),
                               "median_max_over_min": statistics.median(max(m) / min(m) - 1 for m in each)}
    return out


def format_table(points: list[Point]) -> str:
    lines = ["| engine | B | measured | predicted (interval) | error | drafted | realised AL |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        al = f"{p.realised_al:.2f}" if p.realised_al else "-"
        lines.append(f"| {p.engine} | {p.batch_size} | {p.measured:.2f}× | {p.predicted:.2f}× "
                     f"({p.low:.2f}–{p.high:.2f}) | {100 * p.error:+.0f} % | {p.drafted_fraction:.2f} | {al} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- CLI
def batch_sizes(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("phase", choices=("calibrate", "measure", "analyze", "profile", "_engine"))
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("GCL_WORKDIR", "/tmp/gcl")))
    parser.add_argument("--only", default=None, help="calibrate: plan engines whose label starts with one of these; measure: engine labels")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every engine (calibrate, measure)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON", dest="sets",
                        help="calibrate: any ProbeConfig field, e.g. --set context_len=8192 --set kv_cache_dtype='\"fp8\"'")
    parser.add_argument("--quantization", default=None,
                        help="the target's vLLM quantization in every engine, e.g. fp8 (calibrate, measure)")
    parser.add_argument("--drafter", default=DRAFT,
                        choices=sorted(r["name"] for r in _catalog_rows() if r["kind"] in MODEL_DRAFTER_METHODS),
                        help="calibrate, measure: the model drafter (catalog name; an EAGLE head runs as 'eagle')")
    parser.add_argument("--second-cycle-k", type=int, default=None,
                        help="calibrate: the drafter's whole cycles also at this k (one more engine)")
    parser.add_argument("--cycle-tokens", type=int, default=None,
                        help="calibrate: tokens per timed generation of whole cycles (default: the plan's, "
                             "128 on GPUs)")
    parser.add_argument("--verify-per-k", action="store_true",
                        help="calibrate: one verify engine per k (each on its own full CUDA graphs)")
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                        help="measure: the prompts' length (e.g. 4096: every step reads a long KV cache)")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)),
                        help="measure: the batch sizes, comma separated")
    parser.add_argument("--dynamic-k", default=None,
                        help="measure: also the model drafter at these k (comma separated) with a dynamic table")
    parser.add_argument("--target", default=TARGET,
                        help="measure: the catalog target whose shape is served (another than the calibration's "
                             "8B is priced by --profile or --uncalibrated)")
    parser.add_argument("--steady", action="store_true",
                        help="measure: B requests in flight at each B, each replaced as it finishes (a server at "
                             "concurrency B), into steady.jsonl (benchmarks/gpu_steady_state.py analyzes it)")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--held", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out-json", type=Path, default=None)
    parser.add_argument("--calibration", type=Path, default=None,
                        help="analyze: the run whose calibration predicts --workdir's measurements (default: the same)")
    parser.add_argument("--extra-records", type=Path, action="append", default=[],
                        help="profile: record files (repo-relative) whose target decode steps join the fit")
    parser.add_argument("--pool", type=Path, action="append", default=[],
                        help="profile: another run whose calibration records join --workdir's in one fit (repeatable)")
    parser.add_argument("--profile", action="store_true",
                        help="analyze: predict from the engine profile the product prices the run's GPU x "
                             "vLLM 0.24 by (its own, or one carried to it), no calibration")
    parser.add_argument("--calibrated-profile", action="store_true",
                        help="analyze: predict from the calibration and that profile together, as a scenario naming "
                             "vLLM 0.24 after its user calibrated (the profile times a method the run did not)")
    parser.add_argument("--uncalibrated", action="store_true",
                        help="analyze: predict from the catalog's defaults alone (no calibration, no profile)")
    parser.add_argument("--pooled-with", type=Path, action="append", default=[], metavar="RUN",
                        help="analyze: an earlier calibration whose timing records the fit pools (as the product's "
                             "jobs pool a node's earlier runs of the same conditions); repeatable")
    parser.add_argument("--remeasured", type=Path, action="append", default=[],
                        help="analyze: a later measurement of the same engines (repeatable); the points are "
                             "compared with the geometric mean of all measurements")


def main(args: argparse.Namespace) -> int:
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.phase == "calibrate":
        variant = {k: v for k, v in (("cycle_decode_tokens", args.cycle_tokens),
                                     ("verify_engine_per_k", args.verify_per_k or None),
                                     ("quantization", args.quantization)) if v is not None}
        for item in args.sets:
            key, _, value = item.partition("=")
            value = json.loads(value)
            variant[key] = tuple(value) if isinstance(value, list) else value
        return calibrate(args.workdir, args.only.split(",") if args.only else None, args.tp, args.drafter,
                         args.second_cycle_k, **variant)
    if args.phase == "measure":
        return measure(args.workdir, args.only.split(",") if args.only else None, args.tp, args.drafter,
                       args.quantization, args.prompt_tokens, batch_sizes(args.batch_sizes), args.target,
                       batch_sizes(args.dynamic_k) if args.dynamic_k else (), args.steady)
    if args.phase == "_engine":
        target, draft = shapes(args.workdir, args.drafter, args.target)
        case = json.loads(args.case)
        _measure_engine(EngineCase(**{**case, "acceptances": tuple(case["acceptances"])}), target, draft,
                        args.workdir / ("steady.jsonl" if args.steady else "measurements.jsonl"), args.tp,
                        args.held, args.quantization, args.prompt_tokens, batch_sizes(args.batch_sizes),
                        args.steady)
        return 0
    if args.phase == "profile":
        print(json.dumps(write_profile(args.workdir.resolve(), extra=tuple(args.extra_records),
                                       pool=tuple(args.pool)), indent=1))
        return 0
    return analyze(args.workdir, args.out_json, args.calibration, tuple(args.remeasured), args.profile,
                   tuple(args.pooled_with), args.uncalibrated, args.calibrated_profile)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cli_args(p)
    raise SystemExit(main(p.parse_args()))
