"""The ``advisor`` command: serve, predict, plan, step-time, validate, calibrate, worker, monitor, tokens, catalog,
report."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from flask.cli import FlaskGroup, with_appcontext
from marshmallow import ValidationError


def _create_app():  # noqa: ANN202
    from . import create_app

    return create_app()


@click.group(cls=FlaskGroup, create_app=_create_app, add_default_commands=True, add_version_option=False)
def main() -> None:
    """specadvisor: does speculative decoding in vLLM pay off for this workload?"""


def _read_json_list(path: str, what: str) -> list[Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8") if path != "-" else sys.stdin.read())
    except (OSError, json.JSONDecodeError) as exc:
        raise click.BadParameter(f"cannot read {what}: {exc}") from None
    if not isinstance(data, list):
        raise click.BadParameter(f"{what} must be a JSON list")
    return data


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@main.command()
@click.option("--scenarios", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="JSON list of scenarios (the POST /v1/recommendations body).")
@click.option("--store", is_flag=True, help="Also store each answer as a recommendation.")
@with_appcontext
def predict(scenarios: str, store: bool) -> None:
    """Print a JSON list of answers, one per scenario, in order (an error object where one is invalid)."""
    from .errors import ApiError, flatten_messages
    from .schemas import ScenarioSchema
    from .services import recommendations

    answers, failed = [], 0
    for raw in _read_json_list(scenarios, "scenarios"):
        try:
            scenario = ScenarioSchema().load(raw)
            if store:
                answers.append(recommendations.create(scenario))
            else:
                answers.append(recommendations.predict(scenario).data)
        except ValidationError as exc:
            failed += 1
            answers.append({"error": {"status": 422, "code": "validation_error",
                                      "fields": flatten_messages(exc.messages)}})
        except ApiError as exc:
            failed += 1
            answers.append({"error": {"status": exc.status, "code": exc.code, "message": exc.message,
                                      "fields": exc.fields}})
    _echo_json(answers)
    sys.exit(1 if failed else 0)


@main.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="JSON object: the POST /v1/plans body (workload, load, SLO, candidate GPUs, ...).")
@click.option("--store", is_flag=True, help="Also store the plan (then it has an id and a report page).")
@with_appcontext
def plan(spec_path: str, store: bool) -> None:
    """Print a capacity plan as JSON: GPUs × TP × with/without speculation, ranked by monthly cost."""
    from .errors import ApiError, flatten_messages
    from .plan_schemas import PlanRequestSchema, PlanSchema
    from .services import plans

    try:
        raw = json.loads(Path(spec_path).read_text(encoding="utf-8") if spec_path != "-" else sys.stdin.read())
    except (OSError, json.JSONDecodeError) as exc:
        raise click.BadParameter(f"cannot read the plan spec: {exc}") from None
    try:
        request = PlanRequestSchema().load(raw)
        if store:
            answer = PlanSchema().dump(plans.as_dict(plans.create(request)))
        else:
            answer = PlanSchema().dump({"request": request, **plans.compute(request)})
    except ValidationError as exc:
        _echo_json({"error": {"status": 422, "code": "validation_error", "fields": flatten_messages(exc.messages)}})
        sys.exit(1)
    except ApiError as exc:
        _echo_json({"error": {"status": exc.status, "code": exc.code, "message": exc.message, "fields": exc.fields}})
        sys.exit(1)
    _echo_json(answer)


@main.command("step-time")
@click.option("--queries", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help='JSON list of {"gpu", "model", "batch", "query_tokens", "context_tokens"}.')
@with_appcontext
def step_time(queries: str) -> None:
    """Print a JSON list of {"step_time_ms": …}: catalog roofline, or the newest calibration's fit."""
    from . import costmodel
    from .services import calibrations, catalog

    out = []
    for q in _read_json_list(queries, "queries"):
        try:
            gpu = catalog.gpu_spec(catalog.require_gpu(q["gpu"]))
            model = catalog.model_spec(catalog.require_model(q["model"], "model"))
            calibration = calibrations.calibration_for(gpu.name, model.name)
            params = calibration.step_time.get(model.name) if calibration else None
            seconds = costmodel.step_time_s(gpu, model, int(q["batch"]), int(q["query_tokens"]),
                                            int(q["context_tokens"]), weights_dtype=q.get("weights_dtype", "bf16"),
                                            gpu_count=int(q.get("gpu_count", 1)), params=params)
            out.append({"step_time_ms": seconds * 1e3,
                        "source": calibration.timing_source if params else "catalog"})
        except (KeyError, TypeError, ValueError) as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:  # ApiError: unknown GPU or model
            out.append({"error": getattr(exc, "message", str(exc))})
    _echo_json(out)


@main.command(with_appcontext=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def validate(ctx: click.Context) -> None:
    """Predict every published case and compare (exits non-zero when the accuracy target is missed)."""
    import argparse

    from benchmarks import validate as bench

    parser = argparse.ArgumentParser(prog="advisor validate")
    bench.add_cli_args(parser)
    sys.exit(bench.main(parser.parse_args(ctx.args)))


@main.command()
@click.argument("rec_id", type=int)
@click.option("--out", required=True, type=click.Path(dir_okay=False, writable=True, path_type=Path),
              help="HTML file to write (self-contained: opens offline).")
@with_appcontext
def report(rec_id: int, out: Path) -> None:
    """Write a stored recommendation's report (verdict, plots, vLLM settings, provenance) as one HTML file."""
    from .errors import ApiError
    from .reports import write_report

    try:
        write_report(rec_id, out)
    except ApiError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"wrote {out}")


@main.command()
@click.option("--interval", default=60.0, show_default=True, type=click.FloatRange(min=1.0),
              help="Seconds between scrapes of every registered deployment.")
@click.option("--once", is_flag=True, help="Scrape every deployment once and exit (for cron).")
@with_appcontext
def monitor(interval: float, once: bool) -> None:
    """Scrape every registered deployment's /metrics on an interval and store the snapshots (runs until stopped)."""
    import time

    from .services.deployments import scrape_all

    while True:
        started = time.monotonic()
        for deployment_id, state in scrape_all():
            click.echo(f"deployment {deployment_id}: {state}")
        if once:
            return
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


@main.command("create-token")
@click.argument("name")
@with_appcontext
def create_token_cmd(name: str) -> None:
    """Create an API token; it is printed once and stored only as a hash."""
    from .auth import create_token

    click.echo(create_token(name))


@main.command("revoke-token")
@click.argument("prefix")
@with_appcontext
def revoke_token_cmd(prefix: str) -> None:
    """Revoke tokens by their first 8 characters."""
    from .auth import revoke_token

    click.echo(f"revoked {revoke_token(prefix)} token(s)")


@main.command("seed-catalog")
@click.option("--overwrite", is_flag=True, help="Reset shipped entries to the shipped values.")
@with_appcontext
def seed_catalog_cmd(overwrite: bool) -> None:
    """Load the shipped GPU and model catalogs into the database."""
    from .storage import seed_catalog

    click.echo(json.dumps(seed_catalog(overwrite=overwrite)))


@main.command("migrate", with_appcontext=False)  # its own app: no auto-migrate, no schema check
@click.option("--revision", default=None, help="Target revision (default: head; required with --down).")
@click.option("--down", is_flag=True, help="Roll back to --revision (e.g. 0001, or base: drops every table).")
@click.option("--yes", is_flag=True, help="Do not ask before rolling back to base.")
def migrate(revision: str | None, down: bool, yes: bool) -> None:
    """Apply (or roll back) Alembic migrations on DATABASE_URL or the SQLite default."""
    from . import create_app
    from .extensions import db
    from .storage import downgrade, upgrade

    if down and not revision:
        raise click.UsageError("--down needs a target: --revision 0001 (one step back) or --revision base "
                               "(drops every table and its data).")
    app = create_app({"AUTO_MIGRATE": False, "CHECK_SCHEMA": False})
    with app.app_context():
        if down:
            where = db.engine.url.render_as_string(hide_password=True)
            if revision == "base" and not yes:
                click.confirm(f"Drop every specadvisor table and its data in {where}?", abort=True)
            downgrade(db.engine, revision)
        else:
            upgrade(db.engine, revision or "head")
    click.echo(f"database at {revision or 'head'}")


@main.command(with_appcontext=False)  # creates the app itself, once, before gunicorn
@click.option("--host", default=None, help="Default: SPECADVISOR_BIND's host, else 127.0.0.1.")
@click.option("--port", default=None, type=int, help="Default: SPECADVISOR_BIND's port, else 8000.")
@click.option("--workers", default=None, type=int, help="Worker processes (default: SPECADVISOR_WORKERS or cores).")
@click.option("--threads", default=None, type=int, help="Threads per worker (default: SPECADVISOR_THREADS or 64).")
def serve(host: str | None, port: int | None, workers: int | None, threads: int | None) -> None:
    """Migrate, seed the catalogs, then serve the API with gunicorn (gthread workers, advisor/gunicorn_conf.py)."""
    from . import create_app
    from .config import default_instance_path

    _require_writable(default_instance_path())
    create_app()  # applies migrations and seeds once, before the workers start
    os.environ["SPECADVISOR_AUTO_MIGRATE"] = "0"  # the workers only check the schema
    bind_host, _, bind_port = os.environ.get("SPECADVISOR_BIND", "127.0.0.1:8000").rpartition(":")
    os.environ["SPECADVISOR_BIND"] = f"{host or bind_host or '127.0.0.1'}:{port or bind_port or 8000}"
    if workers:
        os.environ["SPECADVISOR_WORKERS"] = str(workers)
    if threads:
        os.environ["SPECADVISOR_THREADS"] = str(threads)
    os.execv(sys.executable, [sys.executable, "-m", "gunicorn", "-c", "python:advisor.gunicorn_conf"])


def _require_writable(folder: Path) -> None:
    """The instance folder (SQLite file, calibration logs) must be writable: say so plainly, not with a trace."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise click.ClickException(
            f"{folder} is not writable by uid {os.getuid()} (gid {os.getgid()}): {exc.strerror}. Make it writable "
            f"for this user (e.g. chown {os.getuid()} {folder}, or chmod g+w with group {os.getgid()}), or set "
            "SPECADVISOR_INSTANCE to a writable folder.") from None


@main.command(with_appcontext=False)
@click.option("--hardware", required=True, help="Listen on the queue named for this hardware (GPU name).")
@click.option("--burst", is_flag=True, help="Exit when the queue is empty.")
def worker(hardware: str, burst: bool) -> None:
    """Run an RQ worker for calibration jobs on this GPU node (needs REDIS_URL)."""
    from redis import Redis
    from rq import Queue, Worker

    from .services.calibrations import queue_name

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    connection = Redis.from_url(url)
    queue = Queue(queue_name(hardware), connection=connection)
    click.echo(f"listening on '{queue.name}' at {url}")
    Worker([queue], connection=connection).work(burst=burst)


@main.command(with_appcontext=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                                 "help_option_names": []})
@click.pass_context
def calibrate(ctx: click.Context) -> None:
    """Run calibration probes with vLLM here; store locally or upload (--server URL --token T). See --help."""
    from calibration import cli as calibration_cli

    sys.exit(calibration_cli.main(ctx.args))


if __name__ == "__main__":
    main()
