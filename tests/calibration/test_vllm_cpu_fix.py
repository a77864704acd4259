"""vLLM behaviour the probes change: the CPU build's expand_kernel bug (vllm-cpu 0.32) and our plugin that fixes it;
the registry's model inspection, which a probe engine's process does in process."""

from __future__ import annotations

import importlib.util
import json

import pytest


def _vllm_skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install .[cpu] on CPU machines)"
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        return f"vllm does not import: {type(exc).__name__}: {exc}"
    return None


VLLM_SKIP_REASON = _vllm_skip_reason()
pytestmark = pytest.mark.skipif(VLLM_SKIP_REASON is not None, reason=VLLM_SKIP_REASON or "")


def _shipped_expand_impl():
    """vLLM's own ``_expand_kernel_impl`` as shipped (a fresh copy of the module, unpatched)."""
    import vllm._custom_ops  # noqa: F401  (loads torch.ops._C on the CPU build)
    from vllm.utils import cpu_triton_utils

    spec = importlib.util.spec_from_file_location("_shipped_cpu_triton_utils", cpu_triton_utils.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._expand_kernel_impl


def _case(dtype):
    import torch

    values = torch.tensor([0.8, -1.0, 0.5], dtype=dtype) if dtype.is_floating_point else \
        torch.tensor([5, -1, 7], dtype=dtype)
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    expected = torch.tensor([0.8, 0.8, 1.0, 1.0, 1.0, 0.5], dtype=dtype) if dtype.is_floating_point else \
        torch.tensor([5, 5, 1, 1, 1, 7], dtype=dtype)
    return values, cu, expected


@pytest.mark.parametrize("dtype_name", ["float32", "int32", "int64"])
def test_fixed_expand_writes_output_in_place(dtype_name):
    import torch

    from calibration.vllm_cpu.plugin import expand_kernel_impl

    dtype = getattr(torch, dtype_name)
    values, cu, expected = _case(dtype)
    out = torch.full((8,), 123, dtype=dtype)
    expand_kernel_impl(out, values, cu, -1, 1)
    assert torch.equal(out[:6], expected)
    assert torch.equal(out[6:], torch.full((2,), 123, dtype=dtype))  # untouched past the tokens


def test_shipped_fallback_leaves_float_output_unwritten():
    """Documents the bug the plugin works around: if this starts failing, upstream fixed it."""
    import torch

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the fallback kernel only exists on vLLM's CPU platform")
    shipped = _shipped_expand_impl()
    values, cu, expected = _case(torch.float32)
    out = torch.full((6,), 123.0)
    shipped(out, values, cu, -1, 1)
    assert not torch.equal(out, expected), "vLLM's CPU expand kernel works now: the plugin may be dropped"


def test_register_is_idempotent_and_patches_the_cpu_fallback():
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils

    from calibration.vllm_cpu import plugin

    first = plugin.register()
    second = plugin.register()
    assert first == second == current_platform.is_cpu()
    if current_platform.is_cpu():
        assert cpu_triton_utils._expand_kernel_impl is plugin.expand_kernel_impl


def test_plugin_entry_point_is_installed():
    """vLLM's engine processes load the fix only through the ``vllm.general_plugins`` entry point."""
    from calibration.vllm_cpu import plugin

    assert plugin.is_installed(), (
        "entry point missing: setup.cfg needs `vllm.general_plugins = specadvisor_cpu_fix = "
        "calibration.vllm_cpu.plugin:register` and the project installed (pip install -e .)"
    )


_INSPECT = """
import json, subprocess, sys
from pathlib import Path
in_process = sys.argv[1] == "in-process"
if in_process:
    from calibration.probes import inspect_models_in_process
    assert inspect_models_in_process()
    run = subprocess.run
    def run_but_not_the_registry(args, *a, **k):
        assert "vllm.model_executor.models.registry" not in args, "the registry's subprocess was started"
        return run(args, *a, **k)
    subprocess.run = run_but_not_the_registry
from vllm.model_executor.models.registry import ModelRegistry
ModelRegistry.models["LlamaForCausalLM"].inspect_model_cls()
(cached,) = (Path(sys.argv[2]) / "modelinfos").glob("*LlamaForCausalLM.json")
print(json.dumps(json.loads(cached.read_text())))
"""


def test_probe_engines_inspect_the_model_in_process_as_vllms_subprocess_does(tmp_path):
    """A probe engine's process reads the architecture's interfaces itself (no second import of vLLM in a
    subprocess, 17 s of each engine start on a fresh H200 node), and vLLM caches the same answer as its own
    subprocess gives."""
    import os
    import subprocess
    import sys

    caches = {}
    for route in ("subprocess", "in-process"):
        root = tmp_path / route
        env = {**os.environ, "VLLM_CACHE_ROOT": str(root)}
        done = subprocess.run([sys.executable, "-c", _INSPECT, route, str(root)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        caches[route] = json.loads(done.stdout.strip().splitlines()[-1])
    assert caches["in-process"] == caches["subprocess"]
    assert caches["in-process"]["modelinfo"]["is_text_generation_model"] is True
