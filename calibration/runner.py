"""Run the probes of one calibration request in this process and stream events as JSON lines.

``python -m calibration.runner REQUEST_JSON`` is what a calibration job starts: vLLM runs in a child
process of the job, so a crash, an OOM kill or a time-out ends the child, never the worker, and every
measurement already streamed is kept. Events go to the original stdout, one JSON object per line:
``{"event": "environment", "environment": {...}}``, ``{"event": "measurement", "record": {...}}``,
``{"event": "progress", "progress": 0.4, "message": "..."}``, ``{"event": "done", "status": "...",
"error": "..."}``. Everything else (vLLM's logs, prints) is sent to stderr.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from .probes import DrafterSpec, ProbeConfig

PROBE_CONFIG_FIELDS = {f.name for f in dataclasses.fields(ProbeConfig)}
SMOLLM2_CATALOG_NAME = "smollm2-135m-instruct"


def to_record(measurement: Any) -> dict[str, Any]:
    """A probe dataclass -> the stored shape ``{"probe", "params": {"engine"}, "values"}``."""
    values = dataclasses.asdict(measurement) if dataclasses.is_dataclass(measurement) else dict(measurement)
    probe = values.pop("probe")
    values.pop("environment", None)
    engine = values.pop("engine", {})
    return {"probe": probe, "params": {"engine": engine}, "values": values}


def probe_config(request: dict[str, Any]) -> ProbeConfig:
    """A calibration request (``CalibrationRequestSchema``) -> the probe runner's configuration."""
    model = request.get("model_path")
    if not model and request["target_model"] != SMOLLM2_CATALOG_NAME:
        raise ValueError(f"model_path is needed to run '{request['target_model']}' on this node")
    method, k = request.get("method", "ngram"), int(request.get("num_speculative_tokens", 4))
    if method == "ngram":
        drafter = DrafterSpec("ngram", k)
    elif method == "draft_model":
        drafter = DrafterSpec("draft_model", k, model=request.get("draft_model_path") or "self",
                              label=request.get("draft_model"))
    else:
        drafter = DrafterSpec(method, k, model=request.get("draft_model_path") or request.get("draft_model"),
                              label=request.get("draft_model"))
    probes = set(request.get("probes") or ("timing", "acceptance", "memory"))
    if "prefill" in probes:
        probes = (probes - {"prefill"}) | {"timing"}
    overrides = {k: v for k, v in (request.get("engine") or {}).items() if k in PROBE_CONFIG_FIELDS}
    for key in ("batch_sizes", "verify_ks", "prompt_lengths", "structures", "temperatures"):
        if key in overrides:
            overrides[key] = tuple(overrides[key])
    config = ProbeConfig(
        model=model or None, probes=tuple(sorted(probes)), drafters=(drafter,),
        structures=tuple(request.get("structures") or ProbeConfig.structures),
        temperatures=tuple(request.get("temperatures") or ProbeConfig.temperatures),
        batch_sizes=tuple(request.get("batch_sizes") or ProbeConfig.batch_sizes),
        verify_ks=tuple(sorted({k, *ProbeConfig.verify_ks})),
        prompts_per_probe=int(request.get("prompts_per_structure", ProbeConfig.prompts_per_probe)),
        max_tokens=int(request.get("max_tokens", ProbeConfig.max_tokens)),
    )
    unknown = sorted(set(request.get("engine") or {}) - PROBE_CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"unknown engine settings: {', '.join(unknown)}; known: {sorted(PROBE_CONFIG_FIELDS)}")
    return dataclasses.replace(config, **overrides)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    events = os.fdopen(os.dup(1), "w", buffering=1)  # our channel: the original stdout
    os.dup2(2, 1)  # anything else printed to stdout (vLLM, tqdm) goes to stderr

    def emit(event: str, **data: Any) -> None:
        events.write(json.dumps({"event": event, **data}, default=str) + "\n")

    from .probes import ProbeRunError, environment_info, run_probes

    try:
        config = probe_config(json.loads(argv[0]))
    except (IndexError, KeyError, ValueError, TypeError) as exc:
        emit("done", status="failed", error=f"bad calibration request: {exc}")
        return 2
    emit("environment", environment=environment_info())
    try:
        run_probes(config, progress=lambda done, total, msg: emit("progress", progress=done / total, message=msg),
                   on_measurement=lambda m: emit("measurement", record=to_record(m)))
    except ProbeRunError as exc:
        emit("done", status="failed", error=str(exc))
        return 1
    emit("done", status="succeeded")
    return 0


if __name__ == "__main__":
    from .vllm_cpu.env import reexec_with_cpu_env

    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            reexec_with_cpu_env()
    except ImportError:
        pass
    raise SystemExit(main())
