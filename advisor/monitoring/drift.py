"""A live window against the recommendation it was deployed from: drift flags with plain reasons, and the scenario
at the observed operating point (the service re-runs the cost model on it)."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..costmodel.acceptance import INPUT_LOGIT_STD, sigmoid
from ..costmodel.priors import PRIOR_STD

MIN_DRAFTS = 50  # fewer drafts in a window: AL too noisy to flag
MIN_REQUESTS = 3  # fewer finished requests: TPOT too noisy to flag
TPOT_TOLERANCE = 0.05  # measured TPOT this much above the predicted baseline before it is flagged
BAND_Z = 1.645  # the 5–95 % band, as the cost model's speedup interval


@dataclass(frozen=True)
class Expectation:
    """What the recommendation promised (read from its stored answer)."""

    recommendation_id: int | None
    k: int | None
    al: float | None
    al_low: float | None
    al_high: float | None
    al_band_source: str
    break_even_concurrency: float | None
    tpot_ms_baseline: float | None
    tpot_ms_speculative: float | None
    concurrency: float | None
    decision: str | None
    dynamic_sd: list | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def band_logit_std(acceptance_source: str) -> tuple[float, str]:
    """The logit std of the AL band: the cost model's own for stated AL, the priors' for priors."""
    if acceptance_source.startswith("prior"):
        return PRIOR_STD[0], "default:prior logit std (costmodel.priors.PRIOR_STD)"
    return INPUT_LOGIT_STD, "default:input logit std (costmodel.acceptance.INPUT_LOGIT_STD)"


def al_band(per_position: list[float], logit_std: float, z: float = BAND_Z) -> tuple[float, float]:
    """AL = 1 + Σ r_i with every conditional acceptance c_i = r_i / r_(i-1) shifted by ∓z·σ in logit space
    (the intercept uncertainty of the cost model's acceptance model, design.md §2)."""
    r = np.clip(np.asarray(per_position, dtype=float), 1e-6, 1 - 1e-6)
    cond = np.concatenate([[r[0]], r[1:] / r[:-1]]).clip(1e-6, 1 - 1e-6)
    logits = np.log(cond / (1 - cond))
    low = 1.0 + float(np.cumprod(sigmoid(logits - z * logit_std)).sum())
    high = 1.0 + float(np.cumprod(sigmoid(logits + z * logit_std)).sum())
    return low, high


def expectation_from_answer(answer: dict[str, Any], recommendation_id: int | None = None) -> Expectation:
    acc = answer.get("acceptance") or {}
    per_position = acc.get("per_position") or []
    al = acc.get("mean_acceptance_length")
    low = high = None
    std, source = band_logit_std(str(acc.get("source") or ""))
    if per_position:
        low, high = al_band(per_position, std)
        low, high = min(low, al), max(high, al)
    concurrency = (answer.get("concurrency") or {}).get("speculative")
    return Expectation(recommendation_id, answer.get("num_speculative_tokens"), al, low, high, source,
                       answer.get("break_even_concurrency"), (answer.get("tpot_ms") or {}).get("baseline"),
                       (answer.get("tpot_ms") or {}).get("speculative"), concurrency, answer.get("decision"),
                       answer.get("dynamic_sd"))


def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.2f}"


def drift_flags(window: dict[str, Any], expected: Expectation) -> list[dict[str, Any]]:
    """Flags for one window: realised AL outside the predicted band, concurrency beyond the break-even, measured
    TPOT worse than the recommendation's predicted TPOT without speculation."""
    flags: list[dict[str, Any]] = []
    al, drafts = window.get("mean_acceptance_length"), window.get("drafts") or 0
    if al is not None and drafts >= MIN_DRAFTS and expected.al_low is not None and expected.al_high is not None:
        band = f"{expected.al_low:.2f}–{expected.al_high:.2f}"
        if al < expected.al_low:
            flags.append({"flag": "acceptance_below_prediction", "observed": al, "expected": [expected.al_low,
                                                                                             expected.al_high],
                          "reason": f"realised AL {al:.2f} over {drafts:,.0f} drafts is below the predicted {band} "
                                    f"(k={expected.k}): this traffic accepts fewer drafts than assumed; "
                                    "recalibrate acceptance on it or lower k"})
        elif al > expected.al_high:
            flags.append({"flag": "acceptance_above_prediction", "observed": al, "expected": [expected.al_low,
                                                                                             expected.al_high],
                          "reason": f"realised AL {al:.2f} over {drafts:,.0f} drafts is above the predicted {band} "
                                    f"(k={expected.k}): speculation pays more than assumed; a larger k may pay"})
    conc, break_even = window.get("concurrency"), expected.break_even_concurrency
    if conc is not None and break_even is not None and conc > break_even:
        flags.append({"flag": "concurrency_above_break_even", "observed": conc, "expected": break_even,
                      "reason": f"traffic now runs at concurrency {_fmt(conc)}; speculation stops paying above "
                                f"{_fmt(break_even)}: lower k to the answer's dynamic_sd band for it, or switch "
                                f"speculation off"})
    tpot = (window.get("tpot_ms") or {}).get("mean")
    count = (window.get("tpot_ms") or {}).get("count") or 0
    baseline = expected.tpot_ms_baseline
    if tpot is not None and baseline is not None and count >= MIN_REQUESTS and tpot > baseline * (1 + TPOT_TOLERANCE):
        flags.append({"flag": "tpot_worse_than_baseline", "observed": tpot, "expected": baseline,
                      "reason": f"measured TPOT {tpot:.2f} ms is worse than the predicted TPOT without speculation "
                                f"({baseline:.2f} ms in the recommendation): speculation is costing latency here"})
    return flags


def operating_point_scenario(scenario: dict[str, Any], window: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The recommendation's scenario moved to what the window observed: concurrency, prompt and output lengths,
    per-position acceptance (at k = its length). Returns (scenario, path -> source of each replaced value).

    The drafting fraction is not carried (the scenario API has no field for it): the re-run assumes every step
    drafts, as a stated acceptance does.
    """
    out = copy.deepcopy(scenario)
    workload = out.setdefault("workload", {})
    sources: dict[str, str] = {}
    conc = window.get("concurrency")
    if conc is not None and math.isfinite(conc):
        workload["concurrency"] = max(1, int(round(conc)))
        workload.pop("requests_per_second", None)
        sources["workload.concurrency"] = "observed:concurrency"
    for key, field in (("prompt_tokens_per_request", "prompt_tokens"), ("output_tokens_per_request", "output_tokens")):
        mean = (window.get(key) or {}).get("mean")
        if mean is not None and mean >= 1:
            workload[field] = int(round(mean))
            sources[f"workload.{field}"] = f"observed:{key}.mean"
    per_position = window.get("per_position")
    if per_position and (window.get("drafts") or 0) >= MIN_DRAFTS:
        rates = [min(max(float(r), 0.0), 1.0) for r in per_position]
        for i in range(1, len(rates)):  # counts are monotone per position; guard rounding
            rates[i] = min(rates[i], rates[i - 1])
        out["acceptance"] = {"per_position": rates}
        out.setdefault("speculator", {})["num_speculative_tokens"] = len(rates)
        sources["acceptance.per_position"] = "observed:per_position"
        sources["speculator.num_speculative_tokens"] = "observed:number of draft positions"
    return out, sources
