"""Service load benchmark (issue 10): the API under gunicorn against a Flask hello-world anchor.

Both servers start with the same gunicorn settings (``advisor/gunicorn_conf.py``: gthread workers, the same
workers and threads); the anchor is a Flask app whose POST echoes a JSON body and whose GET returns a small JSON
object. A Python load generator (asyncio, raw HTTP/1.1 with keep-alive, ``--clients`` connections) sends
**distinct** scenarios (every POST body differs, so nothing can be answered from a cache), alternating anchor and
service ``--rounds`` times per scenario so that other work on the machine weighs on both alike, and prints
requests/s, latency percentiles and the ratio service / anchor.

Scenarios:
- ``post``: POST /v1/recommendations, distinct scenarios; anchor: POST /echo with a body of the same size.
- ``get``: GET /v1/recommendations/<id> over the stored answers; anchor: GET /hello.
- ``list``: GET /v1/recommendations?page_size=100 (pages 1-10); anchor: GET /hello.
- ``list-keyset``: GET /v1/recommendations?page_size=100&after_id=<a stored id> (keyset pages anywhere in the
  list); anchor: GET /hello.
- ``duplicates``: ``--duplicate-posts`` POSTs from 20 distinct scenarios (the upsert race): counts 5xx and checks
  that every acknowledged id is stored.
- ``slow-clients``: 50 sockets trickle a request header a byte per second while GET /v1/health is timed.
- ``hung-db``: the service against a TCP port that accepts and never answers: status and time of /v1/health
  and of a list request.
- ``in-process``: one POST through the Flask test client: time, and SQL statements per POST (SQLite: the
  service sends its statements to the driver's cursor, past SQLAlchemy's events, so sqlite3 counts them).

Run it under the machine-wide lock: ``flock /tmp/specadvisor-cpu.lock python -m benchmarks.service_load``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SCENARIOS = ("in-process", "post", "get", "list", "list-keyset", "duplicates", "slow-clients", "hung-db")
TARGETS = {"post": 0.25, "get": 0.50, "list": 0.50, "list-keyset": 0.50}


# --- the anchor ---------------------------------------------------------------------------------------------
def make_anchor():  # noqa: ANN201
    """Flask hello world: POST /echo returns the JSON body it got, GET /hello a small JSON object."""
    from flask import Flask, jsonify, request

    app = Flask("anchor")

    @app.post("/echo")
    def echo():
        return jsonify(request.get_json())

    @app.get("/hello")
    def hello():
        return jsonify({"hello": "world"})

    return app


# --- scenarios ---------------------------------------------------------------------------------------------
STRUCTURES = ("code", "json", "sql", "prose", "creative", "rag")


def scenario(i: int) -> dict[str, Any]:
    """The i-th distinct scenario: the README's example with the workload varied (all valid)."""
    rng = random.Random(i)
    return {
        "gpu": rng.choice(("H100-SXM", "H200-SXM", "A100-80GB-SXM", "L40S")), "gpu_count": 1,
        "target_model": "llama-3.1-8b-instruct", "weights_dtype": "bf16",
        "speculator": {"method": "eagle", "draft_model": "eagle-llama-3.1-8b",
                       "num_speculative_tokens": rng.randint(1, 5)},
        "workload": {"prompt_tokens": 64 + i % 100_000, "output_tokens": rng.randint(32, 1024),
                     "temperature": round(rng.random(), 3), "structure": rng.choice(STRUCTURES),
                     "concurrency": rng.randint(1, 256)},
        "acceptance": {"acceptance_rate": round(rng.uniform(0.3, 0.9), 3)}, "gpu_hour_usd": 3.0,
    }


def _request(method: str, path: str, body: bytes | None = None) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAccept: application/json\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body or b"")


READS = {  # the read scenarios' requests (rng, answers stored with ids 1..stored, request number) -> bytes
    "get": lambda rng, stored, i: _request("GET", f"/v1/recommendations/{rng.randint(1, stored)}"),
    "list": lambda rng, stored, i: _request("GET", f"/v1/recommendations?page_size=100&page={1 + i % 10}"),
    "list-keyset": lambda rng, stored, i: _request(
        "GET", f"/v1/recommendations?page_size=100&after_id={rng.randint(101, stored)}"),
}


# --- load generator ----------------------------------------------------------------------------------------
@dataclass
class LoadResult:
    label: str
    requests: int
    seconds: float
    statuses: dict[str, int]
    p50_ms: float
    p99_ms: float
    max_ms: float
    bodies: list[bytes] = field(default_factory=list, repr=False)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {"label": self.label, "requests": self.requests, "rps": round(self.rps, 1),
                "p50_ms": round(self.p50_ms, 1), "p99_ms": round(self.p99_ms, 1), "max_ms": round(self.max_ms, 1),
                "statuses": self.statuses}


async def _read_response(reader) -> tuple[int, bytes]:  # noqa: ANN001
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return status, body


def run_load(port: int, requests: Callable[[int], bytes], *, clients: int, seconds: float | None = None,
             total: int | None = None, label: str = "", keep_bodies: bool = False) -> LoadResult:
    """``clients`` keep-alive connections send ``requests(i)`` for i = 0, 1, … for ``seconds`` or ``total``."""
    import asyncio

    latencies: list[float] = []
    statuses: dict[str, int] = {}
    bodies: list[bytes] = []
    counter = iter(range(10**12))
    deadline = time.perf_counter() + seconds if seconds else float("inf")

    async def client() -> None:
        reader = writer = None
        while time.perf_counter() < deadline:
            i = next(counter)
            if total is not None and i >= total:
                break
            payload = requests(i)
            for attempt in range(3):
                try:
                    if writer is None:
                        reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    start = time.perf_counter()
                    writer.write(payload)
                    status, body = await _read_response(reader)
                    latencies.append(time.perf_counter() - start)
                    statuses[str(status)] = statuses.get(str(status), 0) + 1
                    if keep_bodies:
                        bodies.append(body)
                    break
                except (ConnectionError, asyncio.IncompleteReadError, OSError):
                    if writer is not None:
                        writer.close()
                    reader = writer = None  # the server closed a kept-alive connection (e.g. worker recycled)
                    if attempt == 2:
                        statuses["connection-error"] = statuses.get("connection-error", 0) + 1
        if writer is not None:
            writer.close()

    async def everything() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - start

    elapsed = asyncio.run(everything())
    ordered = sorted(latencies) or [0.0]
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3  # noqa: E731
    return LoadResult(label, len(latencies), elapsed, statuses, pick(0.5), pick(0.99), ordered[-1] * 1e3, bodies)


# --- servers -------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """gunicorn with advisor/gunicorn_conf.py; ``app`` overrides its wsgi_app (the anchor)."""

    def __init__(self, env: dict[str, str], app: str | None = None, workers: int = 2, threads: int = 64,
                 root: Path = REPO_ROOT) -> None:
        """``root``: the source tree to serve (another checkout, for an A/B of two trees)."""
        self.port = _free_port()
        env = {**os.environ, **env, "SPECADVISOR_BIND": f"127.0.0.1:{self.port}", "SPECADVISOR_WORKERS": str(workers),
               "SPECADVISOR_THREADS": str(threads), "SPECADVISOR_ACCESS_LOG": "", "SPECADVISOR_AUTO_MIGRATE": "0",
               "PYTHONPATH": str(root)}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        command = [sys.executable, "-m", "gunicorn", "-c", "python:advisor.gunicorn_conf"] + ([app] if app else [])
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(command, env=env, cwd=root, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # never leave a server behind
            raise

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited: {self.log.read()[-3000:].decode(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=15) as s:
                    s.sendall(_request("GET", "/v1/health"))
                    if s.recv(64).startswith(b"HTTP/1.1"):
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def worker_cpu_s(self) -> tuple[float, float]:
        """(user, system) CPU seconds used so far by the gunicorn workers (Linux /proc)."""
        kids = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        user = system = 0
        for pid in kids:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            user, system = user + int(fields[11]), system + int(fields[12])
        return user / os.sysconf("SC_CLK_TCK"), system / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def prepare_database(url: str) -> None:
    """Migrate and seed once, as ``advisor serve`` does before its workers start."""
    from advisor import create_app

    create_app({"SQLALCHEMY_DATABASE_URI": url, "AUTO_MIGRATE": True})


def vacuum(url: str) -> None:
    """PostgreSQL: VACUUM ANALYZE the stored answers, as autovacuum does after 1,000 + 20 % inserts (on by default;
    this machine's test instance runs with it off). A never-vacuumed table has no visibility map, so a list page's
    COUNT scans the heap (5.5 ms over 8,000 rows, 0.6 ms from an index after the vacuum)."""
    if not url.startswith(("postgres://", "postgresql")):
        return
    import sqlalchemy as sa

    from advisor.config import _normalise_db_url

    engine = sa.create_engine(_normalise_db_url(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("VACUUM ANALYZE recommendations"))
    finally:
        engine.dispose()


# --- measurements --------------------------------------------------------------------------------------------
@dataclass
class Comparison:
    scenario: str
    anchor: list[dict[str, Any]]
    service: list[dict[str, Any]]
    ratio: float
    target: float

    @property
    def met(self) -> bool:
        return self.ratio >= self.target


def compare(name: str, args: argparse.Namespace, service_env: dict[str, str], requests: Callable[[int], bytes],
            anchor_requests: Callable[[int], bytes]) -> Comparison:
    anchor_runs, service_runs = [], []
    for round_ in range(args.rounds):  # alternate: anchor, service, anchor, service
        for kind in ("anchor", "service"):
            server = Server(service_env, "benchmarks.service_load:make_anchor()" if kind == "anchor" else None,
                            args.workers, args.threads)
            try:
                run_load(server.port, anchor_requests if kind == "anchor" else requests, clients=args.clients,
                         seconds=1.0)  # warm up (imports, connections)
                result = run_load(server.port, anchor_requests if kind == "anchor" else requests,
                                  clients=args.clients, seconds=args.seconds, label=f"{name}/{kind}/{round_ + 1}")
            finally:
                server.stop()
            (anchor_runs if kind == "anchor" else service_runs).append(result)
            print(json.dumps(result.summary()), flush=True)
    ratio = statistics.mean(r.rps for r in service_runs) / statistics.mean(r.rps for r in anchor_runs)
    return Comparison(name, [r.summary() for r in anchor_runs], [r.summary() for r in service_runs], ratio,
                      TARGETS[name])


def in_process(url: str, n: int = 300) -> dict[str, Any]:
    import sqlalchemy as sa

    from advisor import create_app
    from advisor.extensions import db

    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "AUTO_MIGRATE": False})
    client = app.test_client()
    statements: list[str] = []

    def trace(dbapi_connection, *_) -> None:  # noqa: ANN001  (BEGIN and COMMIT are the driver's, not counted)
        dbapi_connection.set_trace_callback(
            lambda sql: statements.append(sql) if not sql.startswith(("BEGIN", "COMMIT", "ROLLBACK")) else None)

    with app.app_context():
        counted = db.engine.dialect.name == "sqlite"
        if counted:
            sa.event.listen(db.engine.pool, "checkout", trace)
    for i in range(20):
        client.post("/v1/recommendations", json=scenario(10**6 + i))
    statements.clear()
    start = time.perf_counter()
    for i in range(n):
        assert client.post("/v1/recommendations", json=scenario(2 * 10**6 + i)).status_code == 201
    post_ms = (time.perf_counter() - start) / n * 1e3
    per_post = round(len(statements) / n, 2) if counted else None
    return {"post_ms": round(post_ms, 2), "sql_statements_per_post": per_post}


def duplicates(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    bodies = [json.dumps(scenario(5 * 10**6 + k)).encode() for k in range(20)]
    server = Server(env, None, args.duplicate_workers, args.threads)
    try:
        result = run_load(server.port, lambda i: _request("POST", "/v1/recommendations", bodies[i % 20]),
                          clients=args.clients, total=args.duplicate_posts, label="duplicates", keep_bodies=True)
        acknowledged = {json.loads(b)["id"] for b in result.bodies if b.startswith(b'{"id"')}
        stored: set[int] = set()
        page = 1
        while True:
            listing = run_load(server.port, lambda i: _request("GET", f"/v1/recommendations?page={page}&page_size=100"),
                               clients=1, total=1, keep_bodies=True)
            rows = json.loads(listing.bodies[0])
            stored |= {row["id"] for row in rows}
            if len(rows) < 100:
                break
            page += 1
    finally:
        server.stop()
    server_errors = sum(v for k, v in result.statuses.items() if k.startswith("5") or k == "connection-error")
    return {"posts": result.requests, "workers": args.duplicate_workers, "clients": args.clients,
            "statuses": result.statuses, "server_errors": server_errors,
            "acknowledged": len(acknowledged), "acknowledged_and_stored": len(acknowledged & stored),
            "rps": round(result.rps, 1)}


def slow_clients(args: argparse.Namespace, env: dict[str, str], sockets: int = 50) -> dict[str, Any]:
    server = Server(env, None, args.workers, args.threads)
    stop = threading.Event()

    def trickle() -> None:
        try:
            s = socket.create_connection(("127.0.0.1", server.port))
            for byte in b"GET /v1/health HTTP/1.1\r\nHost: slow\r\nX-Padding: " + b"a" * 10_000:
                if stop.is_set():
                    break
                s.send(bytes([byte]))
                stop.wait(1.0)
            s.close()
        except OSError:
            pass

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(sockets)]
    try:
        for t in threads:
            t.start()
        time.sleep(3.0)  # every slow socket has started its header
        result = run_load(server.port, lambda i: _request("GET", "/v1/health"), clients=4, seconds=args.seconds,
                          label="health-while-slow-clients")
    finally:
        stop.set()
        server.stop()
    return {"slow_sockets": sockets, **result.summary()}


def hung_db(args: argparse.Namespace) -> dict[str, Any]:
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(512)
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: [held.append(hole.accept()[0]) for _ in iter(int, 1)], daemon=True)
    accepting.start()
    env = {"DATABASE_URL": f"postgresql://x@127.0.0.1:{hole.getsockname()[1]}/db", "SPECADVISOR_DB_TIMEOUT_S": "2"}
    server = Server(env, None, args.workers, args.threads)
    out = {}
    try:
        for path, clients in (("/v1/health", 1), ("/v1/recommendations", 1), ("/v1/recommendations", 32)):
            result = run_load(server.port, lambda i: _request("GET", path), clients=clients, total=clients,
                              keep_bodies=True)  # 32 at once: none waits behind the others' stuck requests
            out[path if clients == 1 else f"{path} x{clients} at once"] = {
                "statuses": result.statuses, "seconds": round(result.max_ms / 1e3, 2),
                "json": all(body[:1] == b"{" for body in result.bodies)}
    finally:
        server.stop()
        hole.close()
        for conn in held:
            conn.close()
    return out


@dataclass
class ServiceLoadResult:
    comparisons: list[Comparison] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    parser.add_argument("--database-url", default="", help="default: a fresh SQLite file")
    parser.add_argument("--seconds", type=float, default=8.0, help="per measured run")
    parser.add_argument("--rounds", type=int, default=2, help="anchor/service alternations per scenario")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--stored", type=int, default=2000, help="recommendations stored before the GET scenarios")
    parser.add_argument("--duplicate-posts", type=int, default=3000)
    parser.add_argument("--duplicate-workers", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the results here")


def main(args: argparse.Namespace) -> int:
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    tmp = tempfile.mkdtemp(prefix="specadvisor-load-")
    url = args.database_url or f"sqlite:///{tmp}/load.db"
    env = {"DATABASE_URL": url, "SPECADVISOR_INSTANCE": tmp}
    prepare_database(url)
    out = ServiceLoadResult()
    counter = iter(range(10**12))
    post = lambda i: _request("POST", "/v1/recommendations", json.dumps(scenario(next(counter))).encode())  # noqa
    echo_body = json.dumps(scenario(0)).encode()
    if "in-process" in chosen:
        out.extras["in_process"] = in_process(url)
        print(json.dumps({"in_process": out.extras["in_process"]}), flush=True)
    if "post" in chosen:
        out.comparisons.append(compare("post", args, env, post, lambda i: _request("POST", "/echo", echo_body)))
    if {"get", "list", "list-keyset"} & set(chosen):
        server = Server(env, None, args.workers, args.threads)
        try:
            run_load(server.port, post, clients=args.clients, total=args.stored)
        finally:
            server.stop()
        vacuum(url)
        rng = random.Random(7)
        hello = lambda i: _request("GET", "/hello")  # noqa: E731
        for name, read in READS.items():
            if name in chosen:
                out.comparisons.append(compare(name, args, env,
                                               lambda i, read=read: read(rng, args.stored, i), hello))
    if "duplicates" in chosen:
        out.extras["duplicates"] = duplicates(args, env)
        print(json.dumps({"duplicates": out.extras["duplicates"]}), flush=True)
    if "slow-clients" in chosen:
        out.extras["slow_clients"] = slow_clients(args, env)
        print(json.dumps({"slow_clients": out.extras["slow_clients"]}), flush=True)
    if "hung-db" in chosen:
        out.extras["hung_db"] = hung_db(args)
        print(json.dumps({"hung_db": out.extras["hung_db"]}), flush=True)

    print("\nscenario   anchor req/s   service req/s   ratio   target")
    for c in out.comparisons:
        anchor = statistics.mean(r["rps"] for r in c.anchor)
        service = statistics.mean(r["rps"] for r in c.service)
        print(f"{c.scenario:9s} {anchor:13.0f} {service:15.0f} {c.ratio:7.1%} {c.target:7.0%}"
              f"  {'met' if c.met else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps({"comparisons": [{**asdict(c), "met": c.met} for c in out.comparisons],
                                         **out.extras}, indent=2))
    failed = [c for c in out.comparisons if not c.met]
    dup = out.extras.get("duplicates")
    if dup and (dup["server_errors"] or dup["acknowledged_and_stored"] != dup["acknowledged"]):
        failed.append(dup)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    sys.exit(main(parser.parse_args()))
