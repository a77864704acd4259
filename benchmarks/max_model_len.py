"""Does the command an answer gives start? vLLM's KV-cache check at start against the answer's --max-model-len.

vLLM refuses to start when its KV cache cannot hold one request of ``max_model_len`` tokens (by default the model's
context window: ``vllm/v1/core/kv_cache_utils.py``, ``check_enough_kv_cache_memory``). On the lent GPU, with dummy
weights of the catalog's shapes, for each case (a target, a speculator, a ``gpu_memory_utilization``):

1. the product's answer: :func:`advisor.costmodel.predict` for the scenario on the detected GPU, with ``vram_gb``
   the device's total memory and the case's utilization: ``memory.kv_space_gb``, ``memory.max_model_len`` and the
   serve flags;
2. vLLM started as the flags say but without ``--max-model-len`` (its default, the window): where the answer set
   one, expected to refuse; the error's estimate of the longest length that fits is kept;
3. where the answer set one, vLLM started with it: expected to start and to serve one request of the workload's
   length; its KV cache (bytes and tokens) is kept beside the answer's.

Each start runs in a process of its own, so memory is free between them. Usage (on the GPU machine, after
``scripts/gpu-setup.sh``): ``python -m benchmarks.max_model_len --workdir /tmp/mml --out /tmp/mml/result.json``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# the scheduler limits the answer prices and its command pins (vLLM 0.24's own defaults depend on the GPU and on
# LLM against `vllm serve`: 1024 sequences on 70 GiB cards, 16,384 batched tokens for LLM there)
from advisor.costmodel.memory import MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS

from .gpu_closed_loop import MODEL_DRAFTER_METHODS

TARGET = "llama-3.1-8b-instruct"
DRAFT = "llama-3.2-1b-instruct"
PROMPT_TOKENS, OUTPUT_TOKENS = 1000, 500


@dataclasses.dataclass(frozen=True)
class Case:
    label: str
    method: str  # none | ngram | draft_model | eagle | eagle3
    k: int
    gpu_memory_utilization: float
    drafter: str = DRAFT  # the catalog's model drafter (draft_model, eagle, eagle3)

    @property
    def model_drafter(self) -> str | None:
        """The drafter the case runs (None: n-gram or no speculation)."""
        return self.drafter if self.method in MODEL_DRAFTER_METHODS.values() else None


CASES = (
    Case("ngram-k8-u0.28", "ngram", 8, 0.28),  # ~6 GB of KV: the 8B's 131,072-token window (17 GB) does not fit
    Case("draft-k3-u0.30", "draft_model", 3, 0.30),  # the 1B drafter's weights and KV out of the same space
    Case("ngram-k8-u0.45", "ngram", 8, 0.45),  # ~20 GB: the window fits, no flag
)


@dataclasses.dataclass
class CaseResult:
    label: str
    gpu_memory_utilization: float
    drafter: str | None  # the model drafter (None: n-gram or no speculation)
    answer: dict[str, Any]  # decision, memory.*, serve_flags
    default_start: dict[str, Any]  # vLLM at its default max_model_len
    flagged_start: dict[str, Any] | None  # vLLM at the answer's --max-model-len (where it set one)


def answer_for(case: Case, gpu_name: str, vram_gb: float) -> dict[str, Any]:
    """The product's answer for the case's scenario (the same ``predict`` the service runs)."""
    from advisor import costmodel as cm

    from .gpu_closed_loop import catalog_specs

    gpu, target, draft = catalog_specs(case.drafter, gpu_name, TARGET)
    draft = draft if case.model_drafter else None
    method = "ngram" if case.method == "none" else case.method  # (no speculation: the answer's baseline memory)
    scenario = cm.Scenario(gpu=gpu.name, target_model=target.name,
                           speculator=cm.Speculator(method, draft.name if draft else None, max(case.k, 1)),
                           workload=cm.Workload(PROMPT_TOKENS, OUTPUT_TOKENS, 0.0, "code", concurrency=1),
                           vram_gb=vram_gb, gpu_memory_utilization=case.gpu_memory_utilization,
                           vllm_version="0.24")
    d = cm.predict(scenario, gpu, target, draft, compare_methods=False).to_dict()
    return {"decision": d["decision"], "memory": d["memory"], "serve_flags": (d["vllm"] or {}).get("serve_flags")}


def engine_kwargs(case: Case, workdir: Path, max_model_len: int | None) -> dict[str, Any]:
    """``vllm.LLM`` arguments as the answer's serve flags give them (dummy weights of the catalog's shapes)."""
    from .gpu_closed_loop import shapes

    target_dir, draft_dir = shapes(workdir, case.drafter, TARGET)
    spec: dict[str, Any] | None = {"method": case.method, "num_speculative_tokens": case.k}
    if case.method == "none":
        spec = None
    elif case.method == "ngram":
        spec.update(prompt_lookup_min=2, prompt_lookup_max=5)
    else:
        spec["model"] = draft_dir
    kwargs = {"model": target_dir, "load_format": "dummy", "skip_tokenizer_init": True, "seed": 0,
              "gpu_memory_utilization": case.gpu_memory_utilization, "speculative_config": spec,
              "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    return kwargs


def _start_main(kwargs_json: str) -> int:
    """In a process of its own: start vLLM, serve one request of the workload's length, print what happened."""
    kwargs = json.loads(kwargs_json)
    out: dict[str, Any] = {"max_model_len": kwargs.get("max_model_len")}
    t0 = time.perf_counter()
    try:
        from vllm import LLM, SamplingParams

        from calibration.probes import kv_capacity

        llm = LLM(**kwargs)
        out.update(started=True, startup_s=round(time.perf_counter() - t0, 1), **kv_capacity(llm))
        out["max_model_len"] = llm.llm_engine.vllm_config.model_config.max_model_len
        params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True, detokenize=False)
        res = llm.generate([{"prompt_token_ids": [7] * PROMPT_TOKENS}], params, use_tqdm=False)
        out["served_output_tokens"] = len(res[0].outputs[0].token_ids)
    except Exception as exc:  # noqa: BLE001 (what vLLM said is the measurement)
        text = f"{type(exc).__name__}: {exc}"
        out.update(started=False, startup_s=round(time.perf_counter() - t0, 1), error=text[-1500:])
        est = re.search(r"estimated maximum model length is (\d+)", text)
        out["estimated_max_model_len"] = int(est.group(1)) if est else None
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def start(kwargs: dict[str, Any], log: Path, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.max_model_len", "_start", json.dumps(kwargs)]
    with log.open("a") as err:
        try:  # (vLLM logs to stdout: its memory profile, at DEBUG, is kept in the log too)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout_s,
                                  env={**os.environ, "VLLM_LOGGING_LEVEL": "DEBUG"})
        except subprocess.TimeoutExpired:
            return {"started": False, "error": f"no answer in {timeout_s:g} s"}
        err.write(done.stdout)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:  # the engine's process died (its stderr holds why)
        with log.open() as f:
            tail = f.read()[-1500:]
        return {"started": False, "error": f"exit {done.returncode}: {tail}", "estimated_max_model_len":
                int(m.group(1)) if (m := re.search(r"estimated maximum model length is (\d+)", tail)) else None}
    out = json.loads(line[len("RESULT "):])
    profile = re.findall(r"(?:Available KV cache memory: [\d.]+ GiB|Memory profiling takes.*|CUDA graph memory.*"
                         r"|[Ee]stimated CUDA graph memory.*)", done.stdout)
    return {**out, "memory_log": profile[-6:]}


def run(workdir: Path, cases: tuple[Case, ...] = CASES, timeout_s: float = 240.0,
        out: Path | None = None) -> dict[str, Any]:
    """Every case in turn; the result so far is written to ``out`` after each (a call's time limit keeps it)."""
    import torch

    from calibration.probes import environment_info

    from .gpu_closed_loop import catalog_gpu

    workdir.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    gpu_name, vram_gb = catalog_gpu(props.name), props.total_memory / 1e9  # the cost model's GB are decimal
    results = []
    for case in cases:
        answer = answer_for(case, gpu_name, vram_gb)
        mml = answer["memory"]["max_model_len"]
        log = workdir / f"{case.label}.log"
        default = start(engine_kwargs(case, workdir, None), log, timeout_s)
        flagged = start(engine_kwargs(case, workdir, mml), log, timeout_s) if mml is not None else None
        results.append(CaseResult(case.label, case.gpu_memory_utilization, case.model_drafter, answer, default,
                                  flagged))
        print(json.dumps(dataclasses.asdict(results[-1]))[:600], flush=True)
        result = {"gpu": gpu_name, "device": props.name, "total_memory_bytes": props.total_memory,
                  "environment": environment_info(), "target": TARGET,
                  "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
                  "workload": {"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS},
                  "cases": [dataclasses.asdict(r) for r in results]}
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mml"))
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.add_argument("--only", default=None, help="comma-separated case labels")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per engine start")
    parser.add_argument("--cases", default=None, help="METHOD:K:UTILIZATION[:DRAFTER],... (method none, ngram, "
                        "draft_model, eagle or eagle3; DRAFTER a catalog name, default " + DRAFT + ")")


def main(args: argparse.Namespace) -> int:
    cases = tuple(c for c in CASES if not args.only or c.label in args.only.split(","))
    if args.cases:  # METHOD:K:UTILIZATION[:DRAFTER],...
        cases = tuple(Case("-".join([m, f"k{k}", f"u{u}", *d]), m, int(k), float(u), *d)
                      for m, k, u, *d in (item.split(":") for item in args.cases.split(",")))
    run(args.workdir, cases, args.timeout, args.out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_start":
        raise SystemExit(_start_main(sys.argv[2]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_cli_args(parser)
    raise SystemExit(main(parser.parse_args()))
