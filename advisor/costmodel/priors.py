"""Acceptance priors per method × structure × temperature, from published measurements (wide intervals).

Form (see AcceptanceModel): conditional acceptance at draft position i, temperature T:
    c_i(T) = sigmoid(a + b·i + c·T),  r_i = Π_{j≤i} c_j,  AL(k) = 1 + Σ_{i<k} r_i over drafting steps;
    a fraction f of steps drafts at all (docs/cost-model.md "Acceptance words")
Each base row gives c_0 at T=0 for prose-like chat, the per-position logit slope b and the temperature slope c.
Structure offsets shift the intercept a. Prior std (logit) is wide on purpose: these are not the user's data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .acceptance import logit
from .types import AcceptanceModel, ModelSpec


@dataclass(frozen=True)
class PriorRow:
    first_position_rate: float  # c_0 at T=0 on chat/prose
    position_slope: float  # b (logit per position)
    temperature_slope: float  # c (logit per unit temperature)
    draft_fraction: float  # fraction of steps that draft (n-gram/suffix only find matches sometimes)
    source: str


# Base rows (prose/chat, T=0). Each cites the measurement it is set from.
BASE: dict[str, PriorRow] = {
    # vLLM examples/offline_inference/spec_decode.py --test: EAGLE Llama-3.1-8B MT-bench T=0 AL(k=3)=2.296
    # (=> i.i.d. α≈0.635); c_0=0.65, b=-0.08 gives AL(2)=2.06, AL(3)=2.31.
    "eagle": PriorRow(0.65, -0.08, -0.5, 1.0, "vLLM spec_decode.py EAGLE-LLaMA3.1-8B MT-bench AL(k=3)=2.30"),
    # EAGLE-3 (arXiv 2503.01840) Table 1: acceptance length 6.1 vs EAGLE 3.6-3.9 (tree) on MT-bench, LLaMA-3.1-8B;
    # chain equivalent c_0≈0.78 (vLLM EAGLE-3 benchmarks report AL≈2.8 at k=3).
    "eagle3": PriorRow(0.78, -0.12, -0.5, 1.0, "EAGLE-3 arXiv 2503.01840 Table 1; vLLM EAGLE-3 AL(k=3)~2.8"),
    # Leviathan et al. 2023 Table 3: α 0.5-0.8 for drafts ~10-100× smaller; Llama-3.2-1B for Llama-3.1-8B
    # (ratio 1/6.5) c_0≈0.68 on chat. Size adjustment below (DRAFT_SIZE_LOGIT_PER_DECADE).
    "draft_model": PriorRow(0.68, -0.05, -0.6, 1.0, "Leviathan et al. 2023 Table 3; Spec-Bench SpS vicuna-68m AL 2.28"),
    # Spec-Bench (Xia et al. 2024) PLD on vicuna-7b: overall AL 1.73; matches copy long spans once found
    # (b>0), but only a fraction of steps find a match.
    "ngram": PriorRow(0.60, 0.05, -1.0, 0.45, "Spec-Bench PLD overall AL 1.73 (hemingkx/Spec-Bench)"),
    # SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975): suffix trees over prompts + past outputs match more
    # often and longer than prompt lookup (1.2-1.6× over PLD on agentic / SQL traces).
    "suffix": PriorRow(0.65, 0.05, -1.0, 0.6, "SuffixDecoding arXiv 2411.04975 (vs prompt lookup)"),
    # DeepSeek-V3 technical report §5.4.3: MTP second-token acceptance 85-90 %; reusing one MTP layer for
    # further positions decays quickly (vLLM MTP k>1 reports).
    "mtp": PriorRow(0.87, -0.45, -0.4, 1.0, "DeepSeek-V3 tech report §5.4.3 (MTP acceptance 85-90 %)"),
    # Medusa (Cai et al. 2024) Fig. 3: head-1 top-1 accuracy ~0.6, falling ~0.1 per further head.
    "medusa": PriorRow(0.60, -0.35, -0.5, 1.0, "Medusa arXiv 2401.10774 head accuracies; Spec-Bench Medusa AL 2.32"),
}

# Structure offsets on the intercept (logit). Structured output accepts more than prose; creative less;
# prompt-copying drafters gain most on RAG / summarisation (they copy the context).
STRUCTURE_OFFSET: dict[str, dict[str, float]] = {
    # EAGLE paper (Li et al. 2024) Table 1: HumanEval τ ~10 % above MT-bench (≈ +0.3 logit); JSON/SQL syntax is
    # at least as predictable; creative writing at the low end of MT-bench categories (writing/roleplay).
    "model": {"code": 0.3, "json": 0.4, "sql": 0.35, "prose": 0.0, "creative": -0.5, "rag": -0.1},
    # Prompt lookup decoding (Saxena 2023) README: 2-4× on summarisation / document QA / code editing,
    # ~1× on open chat; Spec-Bench PLD per-task: summarisation and RAG highest.
    "copy": {"code": 0.3, "json": 0.3, "sql": 0.4, "prose": 0.0, "creative": -0.8, "rag": 0.5},
}
COPY_FRACTION: dict[str, float] = {"code": 0.6, "json": 0.6, "sql": 0.65, "prose": 0.45, "creative": 0.2, "rag": 0.8}
STRUCTURE_SOURCE = {
    "model": "EAGLE arXiv 2401.15077 Table 1 (code > chat)",
    "copy": "Saxena 2023 prompt-lookup-decoding; Spec-Bench per-task PLD",
}
DRAFT_SIZE_LOGIT_PER_DECADE = 0.45  # logit gain per 10× draft size (Leviathan 2023 Table 3 trend; vicuna-68m AL 2.28)
REFERENCE_DRAFT_RATIO = 1.0 / 8.0
PRIOR_STD = (0.45, 0.06, 0.25)  # std of (a, b, c) in logit units: wide on purpose
PRIOR_CORRELATION_AB = -0.3


def prior_acceptance(method: str, structure: str, target: ModelSpec | None = None,
                     draft: ModelSpec | None = None) -> AcceptanceModel:
    """The prior AcceptanceModel for a method × structure (temperature enters through c)."""
    row = BASE[method]
    kind = "copy" if method in ("ngram", "suffix") else "model"
    a = logit(row.first_position_rate) + STRUCTURE_OFFSET[kind].get(structure, 0.0)
    fraction = row.draft_fraction
    if kind == "copy":
        base_fraction = COPY_FRACTION["prose"]
        fraction = min(0.95, row.draft_fraction * COPY_FRACTION.get(structure, base_fraction) / base_fraction)
    if method == "draft_model" and target is not None and draft is not None and draft.param_count > 0:
        ratio = draft.param_count / max(target.param_count, 1)
        a += DRAFT_SIZE_LOGIT_PER_DECADE * math.log10(ratio / REFERENCE_DRAFT_RATIO)
    sa, sb, sc = PRIOR_STD
    cov = np.array([[sa * sa, PRIOR_CORRELATION_AB * sa * sb, 0.0],
                    [PRIOR_CORRELATION_AB * sa * sb, sb * sb, 0.0],
                    [0.0, 0.0, sc * sc]])
    short = row.source.split(" (")[0].split(";")[0]
    return AcceptanceModel(
        method=method, drafter=draft.name if draft is not None else None, structure=structure,
        logit_intercept=a, logit_position_slope=row.position_slope, logit_temperature_slope=row.temperature_slope,
        covariance=cov.tolist(), temperature_range=(0.0, 2.0), draft_fraction=fraction,
        source=f"prior:{short}; {STRUCTURE_SOURCE[kind]}",
    )
