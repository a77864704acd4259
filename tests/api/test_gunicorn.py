"""The service as deployed: gunicorn with advisor/gunicorn_conf.py (gthread workers), two worker processes."""
from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from benchmarks.service_load import Server, _request, prepare_database


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gunicorn")
    url = f"sqlite:///{folder / 'g.db'}"
    prepare_database(url)
    running = Server({"DATABASE_URL": url, "SPECADVISOR_INSTANCE": str(folder)}, workers=2, threads=64)
    yield running
    running.stop()


def _get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes, float]:
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_request("GET", path).replace(b"Host: bench\r\n", b"Host: bench\r\nConnection: close\r\n"))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), head + b"\r\n\r\n" + body, time.perf_counter() - start


def test_metrics_sum_every_worker(server):
    for _ in range(40):  # one connection each: the two workers share them
        assert _get(server.port, "/v1/gpus")[0] == 200
    for _ in range(20):
        status, raw, _ = _get(server.port, "/metrics")
        assert status == 200
        head = raw.split(b"\r\n\r\n")[0].decode()
        assert len(re.findall(r"(?im)^content-type:", head)) == 1
        assert re.search(r"(?im)^content-type: text/plain; version=[0-9.]+; charset=utf-8\r?$", head)
        text = raw.decode()
        count = re.search(r'specadvisor_http_requests_total\{method="GET",route="/v1/gpus",status="200"\} (\S+)',
                          text)
        assert count and float(count.group(1)) == 40.0, count  # whichever worker answers, both are summed
    assert "specadvisor_http_request_duration_seconds_bucket" in text


def test_slow_clients_do_not_stall_the_others(server):
    stop = threading.Event()

    def trickle():
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                for byte in b"GET /v1/health HTTP/1.1\r\nHost: slow\r\nX-Padding: " + b"a" * 1000:
                    if stop.is_set():
                        return
                    s.send(bytes([byte]))
                    stop.wait(1.0)
        except OSError:
            pass

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(50)]
    for t in threads:
        t.start()
    try:
        time.sleep(2.5)  # every slow socket has begun its header
        timings = []
        for _ in range(20):
            status, _, seconds = _get(server.port, "/v1/health")
            assert status == 200
            timings.append(seconds)
        assert max(timings) < 2.0, timings  # sync workers: a request waited 30 s for a slow one
    finally:
        stop.set()


def _conf(monkeypatch, tmp_path):  # noqa: ANN001, ANN202
    """advisor/gunicorn_conf.py, imported with PROMETHEUS_MULTIPROC_DIR given: its import would otherwise set it in
    this process for good, and every process the suite starts later (vLLM servers) would keep its metrics there."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    import advisor.gunicorn_conf as conf

    return conf


def _concurrency(gated, app_limit: int, timeout_s: float, callers: int, release: threading.Event) -> int:
    """Most callers inside the app at once, when ``callers`` threads call ``gated`` apps that wait for ``release``."""
    inside, most, lock = [0], [0], threading.Lock()

    def app(environ, start_response):  # noqa: ANN001, ANN202
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        release.wait(5)
        with lock:
            inside[0] -= 1
        return [b"ok"]

    wsgi = gated(app, app_limit, timeout_s)
    threads = [threading.Thread(target=wsgi, args=({}, None)) for _ in range(callers)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    release.set()
    for t in threads:
        t.join(10)
    return most[0]


def test_the_app_runs_on_a_few_threads_at_once_and_a_stuck_request_does_not_queue_the_others(monkeypatch, tmp_path):
    """The gthread workers' threads read headers for any number of slow clients, but only ``app_threads`` of them run
    the app at once (docs/service.md, "Threads in the app"); a request that waited ``app_gate_timeout_s`` goes ahead,
    so requests stuck on a hung database do not hold the others back."""
    conf = _conf(monkeypatch, tmp_path)
    assert 0 < conf.app_threads < conf.threads and conf.app_gate_timeout_s <= 0.1
    assert _concurrency(conf.gated, 2, 10.0, 6, threading.Event()) == 2  # they take turns
    assert _concurrency(conf.gated, 2, 0.05, 6, threading.Event()) == 6  # the turn never came (all stuck): went ahead

    class Worker:
        wsgi = staticmethod(lambda environ, start_response: [b"ok"])

    import gc

    worker = Worker()
    try:
        conf.post_worker_init(worker)
    finally:
        gc.unfreeze()  # post_worker_init froze this test process's objects
    assert worker.wsgi is not Worker.wsgi and worker.wsgi({}, None) == [b"ok"]
