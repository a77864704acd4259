"""gunicorn settings for the API (``advisor serve``, the Dockerfile, compose): ``gunicorn -c python:advisor.gunicorn_conf``.

Worker model: ``gthread``. Each worker process accepts connections in its main thread and hands a connection to
one of its threads only once bytes have arrived, so idle and kept-alive connections hold no thread. A client that
trickles its header a byte at a time does hold one thread until the header is complete, not a whole process as
with ``sync`` workers (where two such clients stalled the service). 64 threads per worker keep threads free
with 50 trickling sockets even when one worker accepted them all (tests/api/test_gunicorn.py). Facing the
internet, put a buffering proxy in front. Requests are CPU-bound (the cost model, JSON), so ``workers`` = cores.

Of a worker's threads, only ``app_threads`` (2) run the app at once; the others read headers, write responses and
wait their turn. Sixteen requests in flight in one process took turns at the GIL and at the gthread worker's own
loop, and ran slower than two at a time (docs/service.md, "Threads in the app"). A request that waits longer than
``app_gate_timeout_s`` for its turn goes ahead anyway, so requests stuck on a hung database (each up to
SPECADVISOR_DB_TIMEOUT_S) do not queue the ones behind them.

Environment: SPECADVISOR_BIND (127.0.0.1:8000), SPECADVISOR_WORKERS (cores), SPECADVISOR_THREADS (64),
SPECADVISOR_APP_THREADS (2; 0: no limit), PROMETHEUS_MULTIPROC_DIR (a fresh temporary folder unless given).
"""
from __future__ import annotations

import os
import shutil
import tempfile

bind = os.environ.get("SPECADVISOR_BIND", "127.0.0.1:8000")
worker_class = "gthread"
workers = int(os.environ.get("SPECADVISOR_WORKERS") or os.cpu_count() or 2)
threads = int(os.environ.get("SPECADVISOR_THREADS", "64"))
app_threads = int(os.environ.get("SPECADVISOR_APP_THREADS", "2"))
app_gate_timeout_s = 0.1
keepalive = 5  # seconds an idle keep-alive connection is kept
timeout = 60  # a worker that stops heart-beating this long is restarted
graceful_timeout = 20
backlog = 2048
limit_request_line = 8190
limit_request_fields = 100
max_requests = 20_000  # recycle workers now and then (bounded memory growth)
max_requests_jitter = 2_000
accesslog = os.environ.get("SPECADVISOR_ACCESS_LOG", "-") or None
control_socket_disable = True  # no control socket: works on a read-only root filesystem
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
wsgi_app = "advisor:create_app()"

# prometheus_client multiprocess mode: every worker writes its samples under this folder, /metrics merges them
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="specadvisor-metrics-")


def on_starting(server) -> None:  # noqa: ANN001
    folder = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    shutil.rmtree(folder, ignore_errors=True)  # samples of an earlier run would be summed in
    os.makedirs(folder, exist_ok=True)


def post_worker_init(worker) -> None:  # noqa: ANN001
    """The app is loaded: its ~150,000 long-lived objects (modules, schemas, SQLAlchemy's tables) leave the
    collector's view (gc.freeze). A full collection walked all of them, ~70 ms with every thread of the worker
    stopped, about every 500 POSTs; now it walks what requests left behind."""
    import gc

    gc.collect()
    gc.freeze()
    if 0 < app_threads < threads:
        worker.wsgi = gated(worker.wsgi, app_threads, app_gate_timeout_s)


def gated(app, limit: int, timeout_s: float):  # noqa: ANN001, ANN201
    """``app`` run by at most ``limit`` threads at once; a thread that waited ``timeout_s`` runs it anyway."""
    import threading

    gate = threading.BoundedSemaphore(limit)

    def wsgi(environ, start_response):  # noqa: ANN001, ANN202
        turn = gate.acquire(timeout=timeout_s)
        try:
            return app(environ, start_response)
        finally:
            if turn:
                gate.release()

    return wsgi


def child_exit(server, worker) -> None:  # noqa: ANN001
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
