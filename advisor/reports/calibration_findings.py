"""What a calibration run found, in words and in plots, from its stored measurement records.

Records are ``{"probe", "params": {"engine": {label, speculative_config, ...}}, "values": {...}}`` as
``calibration/probes.py`` writes them: step_time values carry ``kind`` ("step"/"cycle"/"mixed"/"text_cycle"),
``batch_size``, ``q``, ``temperature``, ``step_s``, ``relative_spread``, ``tokens_per_engine_step`` (cycles also
``engine_step_s`` and ``batch_occupancy``); prefill values
``prompt_len``, ``batch_size``, ``prefill_s``; memory values ``kv_cache_tokens``. A later record of the same cell
replaces an earlier one (a redo of part of the plan appends its records).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from ..costmodel import GpuSpec, ModelSpec, StepTimeParams
from ..costmodel.acceptance import OUTPUT_EXTRAPOLATION
from ..costmodel.steptime import forward_cost, step_time_from_cost

from .formatting import is_number
from .plots import Series


@dataclass(frozen=True)
class Record:
    probe: str
    label: str
    method: str | None  # None: the plain target engine
    k: int | None
    values: dict[str, Any]


def records(measurements: list[dict[str, Any]]) -> list[Record]:
    result = []
    for m in measurements:
        if not isinstance(m, dict) or not isinstance(m.get("values"), dict):
            continue
        engine = (m.get("params") or {}).get("engine") or {}
        spec = engine.get("speculative_config") or {}
        values = m["values"]
        label = str(engine.get("label") or values.get("label") or "target")
        k = spec.get("num_speculative_tokens")
        k = k if isinstance(k, int) else None
        result.append(Record(str(m.get("probe")), label, spec.get("method"), k, values))
    return result


def _engine_role(r: Record) -> str:
    if r.method is None:
        return "decode"
    if r.method == "custom_class" or r.label.startswith("verify"):
        return "verify"
    return str(r.method)


def _step_cells(recs: list[Record]) -> dict[tuple[str, str, int, float, int], float]:
    """(role, kind, q, temperature, batch) -> step/cycle seconds; later records win."""
    cells: dict[tuple[str, str, int, float, int], float] = {}
    for r in recs:
        v = r.values
        if r.probe != "step_time" or not all(is_number(v.get(x)) for x in ("batch_size", "q", "step_s")):
            continue
        key = (_engine_role(r), str(v.get("kind") or "step"), int(v["q"]), float(v.get("temperature") or 0.0),
               int(v["batch_size"]))
        cells[key] = float(v["step_s"])
    return cells


def _series_name(role: str, kind: str, q: int, temperature: float) -> str:
    if kind == "mixed":
        name = f"half verify k={q - 1}, half no drafts"
    elif kind == "text_cycle":
        name = f"{role} cycle on text (k={q - 1})"
    elif role == "decode":
        name = "decode (q=1)"
    elif role == "verify":
        name = "spec step, no drafts (q=1)" if q == 1 else f"verify k={q - 1} (q={q})"
    else:
        name = f"{role} cycle (k={q - 1})"
    return name + (f", T={temperature:g}" if temperature else "")


StepModel = Callable[[int, int, float], float]  # (batch, q, temperature) -> fitted target step seconds


def step_series(measurements: list[dict[str, Any]], fitted_step_s: StepModel | None = None) -> list[Series]:
    """Step (or whole-cycle) time in ms over batch size, one series per engine role, q and temperature; decode
    and verify steps carry the fitted step time when ``fitted_step_s`` is given (drafter cycles are not a
    single target step, so they are shown measured only)."""
    by_name: dict[str, Series] = {}
    for (role, kind, q, temperature, batch), seconds in sorted(_step_cells(records(measurements)).items()):
        name = _series_name(role, kind, q, temperature)
        s = by_name.setdefault(name, Series(name))
        s.x.append(float(batch))
        s.measured.append(seconds * 1e3)
        fit = fitted_step_s is not None and kind == "step" and role in ("decode", "verify")
        s.fitted.append(fitted_step_s(batch, q, temperature) * 1e3 if fit else None)
    return list(by_name.values())


def step_model(fit_params: dict[str, Any], gpu: GpuSpec, model: ModelSpec,
               context_tokens: int = 128) -> StepModel:
    """The stored step-time fit as a function of (batch, q, temperature), through the cost model's step
    time (advisor.costmodel.steptime.step_time_from_cost)."""
    params = StepTimeParams.from_dict(fit_params)
    cost = forward_cost(gpu, model)
    return lambda batch, q, temperature: float(
        step_time_from_cost(cost, params, batch, q, context_tokens, temperature=temperature))


def _prefill_cells(recs: list[Record]) -> dict[tuple[int, int], float]:
    """(batch, prompt_len) -> prefill seconds of the target engine; later records win."""
    cells = {}
    for r in recs:
        v = r.values
        if r.probe == "prefill" and all(is_number(v.get(x)) for x in ("prompt_len", "prefill_s")):
            cells[(int(v.get("batch_size") or 1), int(v["prompt_len"]))] = float(v["prefill_s"])
    return cells


def host_speed_series(measurements: list[dict[str, Any]]) -> list[Series]:
    """The host's core speed through the run (a ``host_speed`` record's readings, once per ``interval_s``), relative
    to its p95: where the run's host-bound timings fell in the host's fast and slow phases."""
    out = []
    for r in records(measurements):
        counts, p95 = r.values.get("iterations"), r.values.get("iterations_p95")
        interval_s = r.values.get("interval_s")
        if r.probe != "host_speed" or not isinstance(counts, list) or not is_number(p95) or not p95 \
                or not is_number(interval_s) or not all(is_number(c) for c in counts):
            continue
        out.append(Series("speed / p95", x=[i * float(interval_s) for i in range(len(counts))],
                          measured=[float(c) / float(p95) for c in counts]))
    return out


def prefill_series(measurements: list[dict[str, Any]]) -> list[Series]:
    by_batch: dict[int, Series] = {}
    for (batch, length), seconds in sorted(_prefill_cells(records(measurements)).items()):
        s = by_batch.setdefault(batch, Series(f"B={batch}"))
        s.x.append(float(length))
        s.measured.append(seconds * 1e3)
        s.fitted.append(None)
    return list(by_batch.values())


def _drafted_share(recs: list[Record], role: str, q: int, batch: int) -> float | None:
    """Drafts per sequence step of the last text-cycle record of (role, q, batch): vLLM's num_drafts over the
    timed repeats' B · steps."""
    share = None
    for r in recs:
        v = r.values
        if (r.probe == "step_time" and v.get("kind") == "text_cycle" and _engine_role(r) == role
                and v.get("q") == q and v.get("batch_size") == batch and is_number(v.get("steps"))
                and is_number(v.get("num_drafts"))):
            runs = max(len(v.get("step_s_samples") or ()), 1)
            share = min(1.0, float(v["num_drafts"]) / max(float(v["steps"]) * batch * runs, 1.0))
    return share


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def findings(measurements: list[dict[str, Any]]) -> list[str]:
    """Plain sentences: what the run measured, relative to a plain decode step of the same batch."""
    recs = records(measurements)
    cells = _step_cells(recs)
    decode = {b: s for (role, kind, q, t, b), s in cells.items() if role == "decode" and q == 1 and t == 0.0}
    out: list[str] = []
    # verify steps at each k, at the largest batch <= 8 that has both a decode and the verify step
    for (role, kind, q, t, b), s in sorted(cells.items()):
        if role == "verify" and kind == "step" and q > 1 and t == 0.0 and b == _pick_batch(cells, role, q, decode):
            out.append(f"A verify step at k={q - 1} (q={q}) costs {s / decode[b]:.2f}× a decode step at B={b} "
                       f"({_ms(s)} vs {_ms(decode[b])}).")
    for (role, kind, q, t, b), s in sorted(cells.items()):
        if role == "verify" and q == 1 and t == 0.0 and b == 1 and b in decode:
            out.append(f"A speculative step without drafts costs {(s - decode[b]) * 1e3:.2f} ms more than a "
                       f"plain decode step at B=1 ({_ms(s)} vs {_ms(decode[b])}): the speculative path's own "
                       "per-step cost (rejection sampler, spec metadata, and host time no longer hidden where the "
                       "engine turns async scheduling off, as vLLM 0.24 does).")
    for (role, kind, q, t, b), s in sorted(cells.items()):
        full = cells.get((role, "step", q, t, b))
        if kind == "mixed" and full and b == _pick_batch(cells, role, q, decode, kind):
            out.append(f"A batch in which half the sequences draft k={q - 1} and half nothing costs {s / full:.2f}× "
                       f"a uniform verify step at B={b} ({_ms(s)} vs {_ms(full)}). With CUDA graphs vLLM replays "
                       "a full graph only for a uniform batch, so a copy drafter (n-gram) that finds a match for "
                       "some sequences only gains less at small batches: the fit prices such steps at no less than "
                       "a floor fitted to these (ragged_step_s).")
    text = [(b, role, q, s) for (role, kind, q, t, b), s in cells.items()
            if kind == "text_cycle" and ("verify", "step", q, t, b) in cells]
    if text:
        b, role, q, s = max(text)
        full = cells[("verify", "step", q, 0.0, b)]
        drafted = _drafted_share(recs, role, q, b)
        share = f"; {drafted:.0%} of the sequences' steps drafted" if drafted is not None else ""
        out.append(f"On the probe prompts' text, {role} cycles (k={q - 1}) at B={b} took {_ms(s)}, {s / full:.2f}× a "
                   f"uniform verify step of that width ({_ms(full)}){share}. A step replays a full CUDA graph only "
                   "when every sequence drafted: the fit takes the floor of the others from these cycles "
                   "(ragged_step_s).")
    for (role, kind, q, t, b), s in sorted(cells.items()):
        if kind == "cycle" and t == 0.0 and b == 1 and b in decode:
            what = "draft-model" if role == "draft_model" else role.replace("_", " ")
            ratio = s / decode[b]
            verdict = (f"it cannot pay off at B=1, since a cycle yields at most {q} tokens" if ratio >= q
                       else f"it pays off only if it yields more than {ratio:.2f} tokens per sequence")
            out.append(f"One {what} cycle (k={q - 1}) at B=1 takes {_ms(s)}, {ratio:.2f}× a decode step; "
                       f"{verdict}.")
    prefill = _prefill_cells(recs)
    if prefill:
        (batch, length), seconds = max(prefill.items(), key=lambda kv: kv[0][0] * kv[0][1] / kv[1])
        out.append(f"Prefill runs at up to {batch * length / seconds:,.0f} tokens/s "
                   f"(B={batch} × {length} tokens in {_ms(seconds)}).")
    kv = {}
    for r in recs:
        if r.probe == "memory" and is_number(r.values.get("kv_cache_tokens")):
            kv[_engine_role(r)] = int(r.values["kv_cache_tokens"])
    if "decode" in kv:
        for role, tokens in kv.items():
            if role not in ("decode", "verify"):
                out.append(f"KV cache: {tokens:,} tokens with the {role.replace('_', ' ')} engine vs "
                           f"{kv['decode']:,} without a drafter "
                           f"({(tokens / kv['decode'] - 1) * 100:+.1f} %).")
    spreads = [float(r.values["relative_spread"]) for r in recs
               if r.probe in ("step_time", "prefill") and is_number(r.values.get("relative_spread"))]
    if spreads:
        out.append(f"Repeats agreed to a median relative spread of {statistics.median(spreads) * 100:.1f} % "
                   f"(worst {max(spreads) * 100:.0f} %, over {len(spreads)} timed cells).")
    out.extend(_drained_cycles(recs))
    out.extend(_co_scheduling(recs))
    out.extend(_host_speed(recs))
    out.extend(_drafting_along_the_output(recs))
    for name, series in acceptance_series(measurements).items():
        if len(series) > 1 and all(s.measured for s in series):
            best = max(series, key=lambda s: s.measured[0])
            worst = min(series, key=lambda s: s.measured[0])
            if best.measured[0] == worst.measured[0]:
                out.append(f"First-position acceptance ({name}): {best.measured[0]:.2f} for every structure "
                           f"({', '.join(one.label for one in series)}).")
                continue
            out.append(f"First-position acceptance ({name}): highest for {best.label} {best.measured[0]:.2f} "
                       f"({best.lower[0]:.2f}–{best.upper[0]:.2f}), lowest for {worst.label} "
                       f"{worst.measured[0]:.2f} ({worst.lower[0]:.2f}–{worst.upper[0]:.2f}).")
    return out


def fit_findings(fits: list[dict[str, Any]], hardware: str, gpu: GpuSpec | None = None) -> list[str]:
    """Sentences about the fits: a prefill that computed faster than the catalog row's peak allows."""
    out = []
    for f in fits:
        eta_f = (f.get("params") or {}).get("compute_efficiency")
        if f.get("kind") == "prefill" and is_number(eta_f) and eta_f > 1.0:
            peak = f" ({gpu.bf16_tflops:g} TFLOP/s)" if gpu is not None else ""
            out.append(f"Prefill computed at {eta_f:.2f}× the catalog's bf16 peak for {hardware}{peak}: the catalog "
                       "row understates this host (matrix units it does not count, or another machine under its "
                       "name). Answers for it follow the measured rate.")
    return out


HOST_SPEED_SWING_NOTE = 1.2  # p95 / p5 of the host's core speed above which the page says what it moves


def _drafting_along_the_output(recs: list[Record]) -> list[str]:
    """A copy drafter's share of steps that drafted over its output checkpoint's tokens and over the whole
    generation, and each draft's acceptance (AL) where both drafted, per structure at the lowest temperature
    measured (the same cells, stopped early)."""
    def cell(r: Record) -> tuple:
        v = r.values
        return v.get("label"), v.get("structure"), v.get("temperature")

    def share(r: Record) -> tuple[float, float, float | None] | None:
        v = r.values
        steps, drafts, tokens, prompts, accepted = (v.get(k) for k in ("decode_steps", "num_drafts", "output_tokens",
                                                                         "num_prompts", "num_accepted_tokens"))
        if not all(is_number(x) and x > 0 for x in (steps, tokens, prompts)) or not is_number(drafts):
            return None
        al = 1.0 + accepted / drafts if is_number(accepted) and drafts > 0 else None
        return tokens / prompts, min(drafts / steps, 1.0), al

    full = {cell(r): share(r) for r in recs if r.probe == "acceptance"}
    lowest: dict[Any, float] = {}
    longest: dict[Any, dict[Any, float]] = {}  # per label and structure: the longest output per prompt
    for (label, structure, t), measured in full.items():
        if is_number(t):
            lowest[label] = min(t, lowest.get(label, t))
        if measured is not None:
            by = longest.setdefault(label, {})
            by[structure] = max(measured[0], by.get(structure, 0.0))
    parts: dict[tuple, list[str]] = {}
    for r in sorted((r for r in recs if r.probe == "acceptance_checkpoint"), key=lambda r: str(cell(r))):
        label, structure, temperature = cell(r)
        early, late = share(r), full.get(cell(r))
        if early is None or late is None or not is_number(temperature) or temperature != lowest[label]:
            continue
        al = f" (AL {early[2]:.2f} and {late[2]:.2f})" if early[2] is not None and late[2] is not None else ""
        parts.setdefault((label, temperature), []).append(
            f"{structure} {early[1]:.0%} over {early[0]:.0f} tokens, {late[1]:.0%} over {late[0]:.0f}{al}")

    def limits(label: Any) -> str:
        lo, hi = (OUTPUT_EXTRAPOLATION * f(longest[label].values()) for f in (min, max))
        return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f}"

    return [f"{label}'s share of steps that drafted, by output length (T = {temperature:g}, the same prompts "
            f"stopped early): {'; '.join(items)}. Answers read the share and each draft's acceptance at the "
            f"workload's output length, up to {OUTPUT_EXTRAPOLATION:g}× each structure's longest output "
            f"({limits(label)} tokens here); for longer outputs, calibrate with --max-tokens at their length."
            for (label, temperature), items in parts.items()]


def _host_speed(recs: list[Record]) -> list[str]:
    """The host's core speed over the run (calibration.contention.HostSpeed), and what moves with it."""
    out = []
    for r in recs:
        swing, n = r.values.get("swing"), len(r.values.get("iterations") or ())
        if r.probe != "host_speed" or not is_number(swing) or n < 2:
            continue
        line = (f"The host's cores ran {float(swing):.2f}× apart in speed over the run (p95 against p5 of a "
                f"{float(r.values.get('window_s', 0.05)) * 1e3:.0f} ms busy loop, {n} readings).")
        if float(swing) > HOST_SPEED_SWING_NOTE:
            line += (" Other tenants of a cloud host slow its cores without steal time; steps that run on the host "
                     "(a separate draft model on vLLM 0.24, n-gram's lookup) vary with it, so calibrate more than "
                     "once or serve such drafters on dedicated cores.")
        out.append(line)
    return out


def _pick_batch(cells: dict, role: str, q: int, decode: dict[int, float], kind: str = "step") -> int | None:
    batches = [b for (r, kd, qq, t, b) in cells if r == role and kd == kind and qq == q and t == 0.0 and b in decode]
    small = [b for b in batches if b <= 8]
    return max(small) if small else (min(batches) if batches else None)


def _drained_cycles(recs: list[Record]) -> list[str]:
    """Whole cycles whose batch drained (``batch_occupancy`` well under B): the largest batch per engine role."""
    drained: dict[str, tuple[int, dict[str, Any]]] = {}
    for r in recs:
        v = r.values
        if r.probe != "step_time" or not all(is_number(v.get(x)) for x in (
                "batch_size", "q", "step_s", "engine_step_s", "batch_occupancy")):
            continue
        b = int(v["batch_size"])
        if float(v["batch_occupancy"]) < 0.8 * b and b >= drained.get(_engine_role(r), (0, {}))[0]:
            drained[_engine_role(r)] = (b, v)
    return [f"{role.replace('_', ' ')} cycles (k={int(v['q']) - 1}) at B={b} drained: their sequences finished at "
            f"different steps, so vLLM ran its iterations at {float(v['batch_occupancy']):.1f} sequences on average, "
            f"{_ms(float(v['engine_step_s']))} each ({_ms(float(v['step_s']))} per cycle of the mean sequence). "
            "The fit prices them per iteration at that occupancy."
            for role, (b, v) in sorted(drained.items())]


def _co_scheduling(recs: list[Record]) -> list[str]:
    """Tokens per engine step should grow ∝ B when a batch is really co-scheduled."""
    per_b: dict[int, float] = {}
    for r in recs:
        v = r.values
        if (r.probe == "step_time" and _engine_role(r) == "decode" and v.get("q") == 1
                and all(is_number(v.get(x)) for x in ("batch_size", "tokens_per_engine_step"))):
            per_b[int(v["batch_size"])] = float(v["tokens_per_engine_step"])
    if len(per_b) < 2:
        return []
    lo, hi = min(per_b), max(per_b)
    growth = per_b[hi] / per_b[lo]
    ok = growth >= 0.9 * hi / lo
    return [f"Batches were {'co-scheduled' if ok else 'NOT fully co-scheduled'}: tokens per engine step grew "
            f"{growth:.0f}× from B={lo} to B={hi} (ideal {hi / lo:.0f}×)."]


def _with_unit(name: str, value: Any) -> str:
    if isinstance(value, bool) or not is_number(value):
        if isinstance(value, (list, tuple)) and all(is_number(v) for v in value):
            return ", ".join(f"{float(v):.3g}" for v in value)
        return "—" if value is None else str(value)
    v = float(value)
    if name.endswith("_per_s"):
        return f"{v / 1e9:,.3g} G/s" if abs(v) >= 1e6 else f"{v:,.3g} /s"
    if name.endswith("_s"):
        return f"{v * 1e6:,.1f} µs" if abs(v) < 1e-3 else f"{v * 1e3:,.3f} ms"
    if name.endswith("_bytes"):
        return f"{v / 2**30:,.3f} GiB"
    if "efficiency" in name or name.endswith(("_fraction", "_probability")):
        return f"{v * 100:.1f} %"
    return f"{v:.4g}"


def fit_param_rows(params: Any) -> list[tuple[str, str]]:
    """A fit's parameters as (name, value with its unit): seconds in ms/µs, rates in G/s, fractions in %."""
    if not isinstance(params, dict):
        return []
    return [(str(name), _with_unit(str(name), value)) for name, value in params.items()
            if not isinstance(value, dict)]


def acceptance_series(measurements: list[dict[str, Any]]) -> dict[str, list[Series]]:
    """Per engine and temperature: acceptance rate per draft position, one series per prompt structure, with a
    95 % Wilson interval over the cell's drafts (accepted_per_pos[i] of num_drafts)."""
    from scipy.stats import binomtest  # lazy: scipy is heavy

    counts: dict[tuple[str, float, str], tuple[list[int], int]] = {}
    for r in records(measurements):
        v = r.values
        per_pos, drafts = v.get("accepted_per_pos"), v.get("num_drafts")
        if r.probe != "acceptance" or not isinstance(per_pos, list) or not is_number(drafts) or not drafts:
            continue
        key = (r.label, float(v.get("temperature") or 0.0), str(v.get("structure") or "prompts"))
        old_pos, old_n = counts.get(key, ([], 0))
        summed = [a + b for a, b in zip(per_pos + [0] * len(old_pos), old_pos + [0] * len(per_pos))]
        counts[key] = (summed[: max(len(per_pos), len(old_pos))], old_n + int(drafts))
    plots: dict[str, list[Series]] = {}
    for (label, temperature, structure), (per_pos, drafts) in counts.items():
        s = Series(structure)
        for position, accepted in enumerate(per_pos, start=1):
            ci = binomtest(int(accepted), drafts).proportion_ci(0.95, method="wilson")
            s.x.append(float(position))
            s.measured.append(accepted / drafts)
            s.fitted.append(None)
            s.lower.append(float(ci.low))
            s.upper.append(float(ci.high))
        plots.setdefault(f"{label}, T={temperature:g}", []).append(s)
    return plots
