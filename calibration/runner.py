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
import re
import sys
from pathlib import Path
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
    """A calibration request (``CalibrationRequestSchema``) -> the probe runner's configuration.

    With ``engine.load_format = "dummy"`` and no checkpoint path, the catalog's shape of the model is written as a
    config (``calibration.models.write_shape``): timing probes without checkpoints; acceptance needs real weights and
    is left out."""
    dummy = (request.get("engine") or {}).get("load_format") == "dummy"
    model = request.get("model_path") or (shape_path(request["target_model"]) if dummy else None)
    if not model and request["target_model"] != SMOLLM2_CATALOG_NAME:
        raise ValueError(f"model_path is needed to run '{request['target_model']}' on this node")
    method, k = request.get("method", "ngram"), int(request.get("num_speculative_tokens", 4))
    if method == "ngram":
        drafter = DrafterSpec("ngram", k)
    elif method == "draft_model":
        draft_path = request.get("draft_model_path") or (
            shape_path(request["draft_model"]) if dummy and request.get("draft_model") else "self")
        drafter = DrafterSpec("draft_model", k, model=draft_path, label=request.get("draft_model"))
    else:
        drafter = DrafterSpec(method, k, model=request.get("draft_model_path") or request.get("draft_model"),
                              label=request.get("draft_model"))
    probes = set(request.get("probes") or ("timing", "acceptance", "memory"))
    if "prefill" in probes:
        probes = (probes - {"prefill"}) | {"timing"}
    overrides = {k: v for k, v in (request.get("engine") or {}).items() if k in PROBE_CONFIG_FIELDS}
    for key in ("batch_sizes", "verify_ks", "prompt_lengths", "structures", "temperatures", "mixed_width_batch_sizes"):
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
    config = dataclasses.replace(config, **overrides)
    if dummy:
        config = dataclasses.replace(config, skip_tokenizer_init=True,
                                     probes=tuple(x for x in config.probes if x != "acceptance"))
    return config


def shape_path(catalog_name: str) -> str:
    """A config-only checkpoint of the packaged catalog's shape of ``catalog_name`` (for ``load_format="dummy"``)."""
    from .models import model_cache_root, write_shape

    catalog = Path(__file__).resolve().parent.parent / "advisor" / "data" / "models.json"
    rows = {r["name"]: r for r in json.loads(catalog.read_text())["items"]}
    if catalog_name not in rows:
        raise ValueError(f"'{catalog_name}' is not in the packaged catalog: give its checkpoint path")
    return str(write_shape(rows[catalog_name], model_cache_root() / "shapes" / catalog_name))


def hardware_mismatch(hardware: str, env: dict[str, Any]) -> str | None:
    """Why this node is not the catalog ``hardware`` a run is stored under (None: it is). A calibration applies only
    to the hardware it measured, so the detected device must match: ``H200-SXM`` needs a GPU named like
    ``NVIDIA H200``; ``CPU-*`` entries need a node without a GPU."""
    gpu = env.get("gpu_name")
    cpu_entry = hardware.upper().startswith("CPU")
    if not gpu:
        return None if cpu_entry or not hardware else \
            f"no GPU found on this node ({env.get('cpu_model') or 'CPU only'}), but the run is for {hardware}"
    if cpu_entry:
        return f"this node has a GPU ({gpu}), but the run is for {hardware}"
    core = re.split(r"[-_ ]", hardware)[0].lower()  # "H200-SXM" -> "h200", "RTX-4090" -> "rtx"
    if core == "rtx":
        core = hardware.lower().replace("rtx-", "").split("-")[0]
    if core not in gpu.lower():
        return f"this node's GPU is {gpu!r}, not {hardware}: pass the catalog name of this GPU"
    return None


def die_with_parent(poll_s: float = 2.0) -> None:
    """End this process group (the runner and its vLLM engines) once the process that started it is gone. The job
    starts the runner in a session of its own, which a job killed outright (RQ's hard kill, OOM) never reaches:
    orphaned engines would keep the cores busy for every later calibration on the node."""
    import signal
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if os.getpgid(0) == os.getpid():  # a group of its own (calibration.jobs.execute): not a caller's
        die_with_parent()
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
    env = environment_info()
    emit("environment", environment=env)
    mismatch = hardware_mismatch(json.loads(argv[0]).get("hardware", ""), env)
    if mismatch:
        emit("done", status="failed", error=f"wrong hardware: {mismatch}")
        return 2
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
