"""gunicorn settings for the API (``advisor serve``, the Dockerfile, compose): ``gunicorn -c python:advisor.gunicorn_conf``.

Worker model: ``gthread``. Each worker process accepts connections in its main thread and only hands a
connection to one of its threads once bytes have arrived; a thread that waits longer than a few seconds for
the rest of a request gives the connection back. So clients that trickle their headers a byte at a time do not
hold every worker the way they do with ``sync`` workers (where one slow client blocks a whole process);
``threads`` is also well above the number of slow sockets one worker meets in practice. Requests are
CPU-bound (the cost model, JSON), so ``workers`` = cores; threads overlap the database and the network.

Environment: SPECADVISOR_BIND (127.0.0.1:8000), SPECADVISOR_WORKERS (cores), SPECADVISOR_THREADS (32),
PROMETHEUS_MULTIPROC_DIR (a fresh temporary folder unless given).
"""
from __future__ import annotations

import os
import shutil
import tempfile

bind = os.environ.get("SPECADVISOR_BIND", "127.0.0.1:8000")
worker_class = "gthread"
workers = int(os.environ.get("SPECADVISOR_WORKERS") or os.cpu_count() or 2)
threads = int(os.environ.get("SPECADVISOR_THREADS", "32"))
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


def child_exit(server, worker) -> None:  # noqa: ANN001
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
