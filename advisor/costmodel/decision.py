"""go / no-go / calibrate (design.md §3 "Decision")."""
from __future__ import annotations

from dataclasses import dataclass

GO_THRESHOLD = 1.05  # speedup lower bound that counts as a gain worth deploying


@dataclass(frozen=True)
class DecisionInput:
    speedup_low: float
    speedup_high: float
    fits: bool  # the deployment exists: target + drafter + at least one sequence's KV fit
    blocking_errors: tuple[str, ...]  # tokenizer mismatch, wrong drafter kind, ...
    outside_calibration: tuple[str, ...]  # why a calibration does not cover the workload


def decide(d: DecisionInput, threshold: float = GO_THRESHOLD) -> tuple[str, list[str]]:
    """Returns (decision, the reasons that drove it)."""
    if d.blocking_errors:
        return "no-go", list(d.blocking_errors)
    if not d.fits:
        return "no-go", ["target + drafter + one sequence's KV exceed VRAM"]
    if d.speedup_high < threshold:  # a clear no-go (even the optimistic end loses) stays no-go, calibrated or not
        return "no-go", [f"speedup upper bound {d.speedup_high:.2f}× below {threshold:.2f}×"]
    if d.outside_calibration:  # design.md §3: beyond what was measured the model extrapolates; measure first
        return "calibrate", [f"outside calibrated range: {r}" for r in d.outside_calibration]
    if d.speedup_low >= threshold:
        return "go", [f"speedup lower bound {d.speedup_low:.2f}× clears {threshold:.2f}×"]
    return "calibrate", [f"speedup interval {d.speedup_low:.2f}–{d.speedup_high:.2f}× straddles {threshold:.2f}×"]
