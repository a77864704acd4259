"""Acceptance: per-position rates, mean acceptance length (AL) and their conversions (design.md §2)."""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq, least_squares

from .memo import cached_when_hashable
from .types import AcceptanceInput, AcceptanceModel, CostModelError

MAX_K = 16  # longest draft accepted as input
SEARCH_K = 8  # longest draft the advisor searches when choosing k (vLLM examples use 1-7)
INPUT_LOGIT_STD = 0.15  # shape uncertainty when a stated AL / acceptance rate is extrapolated to another k
LOGIT_LIMIT = 15.0  # |logit| bound of a stated per-position fit (rates within 3e-7 of 0 or 1)
# Transfer from the prompts acceptance was measured on to the workload's: a calibrated fit's intercept gets this
# extra logit std, and a copy drafter's drafting fraction (how often the output repeats the prompt) is sampled with
# this logit std around its fit or prior. Set from the CPU closed loop's held-out prompt sets (docs/closed-loop.md:
# SQL drafted on 29 % of steps against 12 % predicted from the probe prompts, JSON 44 % against 19 %: ~1.1 logit).
TRANSFER_LOGIT_STD = 0.3
DRAFT_FRACTION_LOGIT_STD = 0.7
# ... and the two move together: prompts whose answers copy more of their context draft more often and accept more of
# each draft. Between two probe sets of the CPU closed loop (ours and the user sample, 18 n-gram cells) the changes in
# logit(drafted fraction) and ln(AL) correlate at 0.87; between the probe set and the held-out workloads (7 n-gram
# workloads) at 0.80 (docs/closed-loop.md, "Drafting and acceptance move together").
DRAFT_FRACTION_ACCEPTANCE_CORR = 0.8
# A copy drafter's drafting fraction over an output of O tokens is referred to O = 64 (draft_fraction_at).
DRAFT_FRACTION_REF_TOKENS = 64.0
# ... and read at most this many times the longest output the probes generated (calibration.fit sets the limit).
# SmolLM2, code, n-gram k = 4, a fit on 64 and 114 tokens per prompt: 22.1 % of steps drafted over 153 tokens, 23.4 %
# measured. Further out it misses: outputs of 252-467 tokens drafted 0.9-2.8× the share read at the limit (an H100,
# docs/gpu-closed-loop.md, "Drafting along the output, end to end").
OUTPUT_EXTRAPOLATION = 2.0


def expected_tokens_iid(alpha: float, k: int) -> float:
    """Leviathan et al. 2023 Eq. 1: E[tokens per step] = (1 − α^(k+1)) / (1 − α)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def walltime_improvement_iid(alpha: float, k: int, cost_ratio: float) -> float:
    """Leviathan et al. 2023 Thm 3.8: (1 − α^(k+1)) / ((1 − α)(k·c + 1)), c = t_draft / t_target."""
    return expected_tokens_iid(alpha, k) / (k * cost_ratio + 1.0)


def al_from_per_position(per_position: np.ndarray, k: int) -> np.ndarray:
    """vLLM: AL = 1 + Σ_{i<k} r_i with r_i = a_i / N (design.md §2)."""
    r = np.asarray(per_position, dtype=float)
    return 1.0 + r[..., :k].sum(axis=-1)


@lru_cache(maxsize=1024)
def alpha_from_al(mean_acceptance_length: float, k: int) -> float:
    """Invert Eq. 1 for the i.i.d. α that gives AL at k (brentq on [0, 1))."""
    if not 1.0 <= mean_acceptance_length <= k + 1:
        raise CostModelError("acceptance.mean_acceptance_length",
                             f"AL {mean_acceptance_length:g} impossible with k={k} (must be in [1, {k + 1}])")
    if mean_acceptance_length >= k + 1 - 1e-9:
        return 1.0 - 1e-9
    if mean_acceptance_length <= 1.0 + 1e-12:
        return 0.0
    return float(brentq(lambda a: expected_tokens_iid(a, k) - mean_acceptance_length, 0.0, 1.0 - 1e-12))


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def per_position_rates(model: AcceptanceModel, temperature: float, k: int = MAX_K,
                       coeffs: np.ndarray | None = None) -> np.ndarray:
    """r_i = Π_{j≤i} sigmoid(a + b·j + c·T); coeffs (S, 3) samples → (S, k), else (k,)."""
    theta = np.array([model.logit_intercept, model.logit_position_slope, model.logit_temperature_slope])
    theta = theta if coeffs is None else np.asarray(coeffs)
    pos = np.arange(k, dtype=float)
    a, b, c = theta[..., 0:1], theta[..., 1:2], theta[..., 2:3]
    conditional = sigmoid(a + b * pos + c * temperature)
    return conditional.cumprod(axis=-1)


def draft_fraction_at(model: AcceptanceModel, temperature: float, output_tokens: float | None = None) -> float:
    """Fraction of an output's decode steps that draft at ``temperature``: sigmoid(φ0 + φ1·T) for calibrated copy
    drafters (``draft_fraction_logit`` set), else the constant ``draft_fraction``; with the probes' output
    checkpoints, + φ2·ln(O / 64) for an output of O = ``output_tokens`` tokens, O read at most at
    ``draft_fraction_output_tokens_up_to`` (calibration.fit: twice the longest output the probes generated)."""
    if model.draft_fraction_logit is None:
        return float(model.draft_fraction)
    logit_f = model.draft_fraction_logit + model.draft_fraction_temperature_slope * temperature
    if model.draft_fraction_output_slope and output_tokens:
        tokens = min(float(output_tokens), model.draft_fraction_output_tokens_up_to or float(output_tokens))
        logit_f += model.draft_fraction_output_slope * math.log(tokens / DRAFT_FRACTION_REF_TOKENS)
    return float(sigmoid(np.asarray(logit_f)))


def at_output(model: AcceptanceModel, output_tokens: float | None) -> AcceptanceModel:
    """``model`` over an output of O = ``output_tokens`` tokens: a calibrated copy drafter's intercept moved by
    logit_output_slope · ln(O / logit_output_ref_tokens), O read at most at ``draft_fraction_output_tokens_up_to``
    (its probes' output checkpoints: the longer the output, the more of each draft it repeats; docs/calibration.md).
    The slope is spent (0), so the model read twice moves once; without a slope the model itself."""
    if not model.logit_output_slope or not model.logit_output_ref_tokens or not output_tokens:
        return model
    tokens = min(float(output_tokens), model.draft_fraction_output_tokens_up_to or float(output_tokens))
    shift = model.logit_output_slope * math.log(tokens / model.logit_output_ref_tokens)
    return dataclasses.replace(model, logit_intercept=model.logit_intercept + shift, logit_output_slope=0.0)


def sample_coefficients(model: AcceptanceModel, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Draws of (a, b, c) from N(mean, covariance); row 0 is the mean (the point estimate)."""
    return coefficients_from_normals(model, rng.standard_normal((samples, 3)))


def coefficients_from_normals(model: AcceptanceModel, std_normal: np.ndarray) -> np.ndarray:
    """sample_coefficients() given the standard-normal draws, shape (S, 3)."""
    mean = np.array([model.logit_intercept, model.logit_position_slope, model.logit_temperature_slope])
    draws = mean + std_normal @ cholesky_factor(model.covariance, 1e-12).T
    draws[0] = mean
    return draws


def cholesky_factor(covariance, jitter: float) -> np.ndarray:
    """Lower Cholesky factor of covariance + jitter·I (read-only, cached per distinct covariance)."""
    return _cholesky(tuple(tuple(float(x) for x in row) for row in covariance), jitter)


@lru_cache(maxsize=1024)
def _cholesky(covariance: tuple[tuple[float, ...], ...], jitter: float) -> np.ndarray:
    cov = np.asarray(covariance, dtype=float)
    chol = np.linalg.cholesky(cov + jitter * np.eye(cov.shape[0]))
    chol.flags.writeable = False
    return chol


def _fit_rates(rates: np.ndarray, intercept: float, slope: float) -> tuple[float, float]:
    """Least squares (scipy) of r_i = Π_{j≤i} sigmoid(a + b·j) on the stated rates, from a starting (a, b)."""
    pos = np.arange(len(rates), dtype=float)

    def residual(theta: np.ndarray) -> np.ndarray:
        return np.cumprod(sigmoid(theta[0] + theta[1] * pos)) - rates

    start = np.clip([intercept, slope], -LOGIT_LIMIT, LOGIT_LIMIT)
    fit = least_squares(residual, start, bounds=([-LOGIT_LIMIT] * 2, [LOGIT_LIMIT] * 2))
    return float(fit.x[0]), float(fit.x[1])


@cached_when_hashable(4096)  # stated words repeat across scenarios; the model is frozen
def model_from_input(given: AcceptanceInput, k_ref: int, method: str, structure: str,
                     drafter: str | None) -> AcceptanceModel:
    """A stated acceptance as an AcceptanceModel (temperature-independent: it was measured at the workload's T).

    Words as vLLM counts them (docs/cost-model.md): ``mean_acceptance_length`` AL = 1 + A/N and ``acceptance_rate``
    ρ = A/D over the steps that drafted, at k = ``k_ref`` (so AL = 1 + k·ρ); ``per_position`` r_i = a_i/N.
    The drafting fraction is not part of them: the caller supplies it.
    """
    std = INPUT_LOGIT_STD
    if given.per_position:
        r = np.asarray(given.per_position, dtype=float)
        if not np.all(np.isfinite(r)) or np.any((r < 0) | (r > 1)):
            raise CostModelError("acceptance.per_position", "rates must be finite and in [0, 1]")
        r = np.clip(r, 1e-6, 1 - 1e-6)
        if np.any(np.diff(r) > 1e-9):
            raise CostModelError("acceptance.per_position", "per-position rates must be non-increasing")
        # conditional rates r_i / r_{i-1}; equal neighbours give 1, kept inside (0, 1) so the logits stay finite
        cond = np.clip(np.concatenate([[r[0]], r[1:] / r[:-1]]), 1e-6, 1 - 1e-6)
        logits = np.log(cond / (1 - cond))
        slope = float(np.polyfit(np.arange(len(r)), logits, 1)[0]) if len(r) > 1 else 0.0
        intercept = float(logits.mean() - slope * (len(r) - 1) / 2.0)
        if len(r) > 1:  # refine on the rates themselves (saturated logits of equal neighbours would dominate)
            intercept, slope = _fit_rates(r, intercept, slope)
        source = "input:per_position"
    elif given.acceptance_rate is not None:
        if not 0.0 <= given.acceptance_rate <= 1.0:
            raise CostModelError("acceptance.acceptance_rate", "must be in [0, 1]")
        alpha = alpha_from_al(1.0 + k_ref * given.acceptance_rate, k_ref)  # AL = 1 + k·A/D
        intercept, slope, source = logit(alpha), 0.0, f"input:acceptance_rate@k={k_ref}"
    elif given.mean_acceptance_length is not None:
        alpha = alpha_from_al(given.mean_acceptance_length, k_ref)
        intercept, slope, source = logit(alpha), 0.0, f"input:mean_acceptance_length@k={k_ref}"
    else:
        raise CostModelError("acceptance", "give mean_acceptance_length, acceptance_rate or per_position")
    cov = np.diag([std ** 2, 0.0025, 0.0]).tolist()
    return AcceptanceModel(method=method, drafter=drafter, structure=structure, logit_intercept=intercept,
                           logit_position_slope=slope, logit_temperature_slope=0.0, covariance=cov,
                           temperature_range=(0.0, 2.0), draft_fraction=1.0, source=source)


def with_transfer_spread(model: AcceptanceModel) -> AcceptanceModel:
    """A calibrated fit as applied to other prompts: its intercept variance plus TRANSFER_LOGIT_STD²."""
    cov = np.array(model.covariance, dtype=float)
    cov[0, 0] += TRANSFER_LOGIT_STD ** 2
    return dataclasses.replace(model, covariance=cov.tolist())


def sample_draft_fraction(fraction: float, std_normal: np.ndarray, intercept_normal: np.ndarray) -> np.ndarray:
    """Draws of a copy drafter's drafting fraction: logit-normal around ``fraction``, its normal correlated at
    DRAFT_FRACTION_ACCEPTANCE_CORR with ``intercept_normal`` (the draws of the acceptance intercept's, so that a
    prompt set that copies more both drafts more and accepts more); draw 0 is ``fraction``."""
    f = min(max(fraction, 1e-6), 1 - 1e-6)
    rho = DRAFT_FRACTION_ACCEPTANCE_CORR
    z = rho * np.asarray(intercept_normal, dtype=float) + math.sqrt(1.0 - rho * rho) * np.asarray(std_normal)
    draws = sigmoid(np.log(f / (1 - f)) + DRAFT_FRACTION_LOGIT_STD * z)
    draws[0] = fraction
    return draws
