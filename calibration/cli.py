"""``advisor calibrate``: run the probes here with vLLM; store into the local database or upload to a service."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .jobs import DbSink, HttpSink, execute


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", required=True, help="catalog GPU name of this node (e.g. H100-SXM, CPU-2core)")
    parser.add_argument("--target-model", required=True, help="catalog name of the target model")
    parser.add_argument("--model-path", help="local path or HF id of the target (SmolLM2-135M: prepared if omitted)")
    parser.add_argument("--method", default="ngram", help="ngram | draft_model | eagle | eagle3 | mtp | suffix")
    parser.add_argument("--draft-model", help="catalog name of the drafter")
    parser.add_argument("--draft-model-path", help="local path or HF id of the drafter ('self' = the target)")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--structures", help="comma-separated structures (default: all six)")
    parser.add_argument("--temperatures", help="comma-separated temperatures (default 0,0.7,1.0)")
    parser.add_argument("--batch-sizes", help="comma-separated batch sizes for the timing probe (default 1,2,4,8)")
    parser.add_argument("--prompts-per-structure", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--probes", help="comma-separated: timing,prefill,acceptance,memory (default all)")
    parser.add_argument("--prompts", help="your own prompts: JSONL of {\"structure\", \"prompt\"}")
    parser.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                        help="probe/engine setting (JSON value), e.g. enforce_eager=false, kv_cache_space_gib=4")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before the probe process is killed")
    parser.add_argument("--no-pool", dest="pool_earlier_runs", action="store_false",
                        help="fit this run's timings alone (default: pooled with up to 3 earlier runs of the same "
                             "conditions)")
    parser.add_argument("--server", help="upload to this service instead of the local database")
    parser.add_argument("--token", help="API token for --server")


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    def split(text: str | None, cast: type) -> list[Any] | None:
        return [cast(x) for x in text.split(",") if x.strip()] if text else None

    engine: dict[str, Any] = {}
    for item in args.engine:
        key, _, raw = item.partition("=")
        try:
            engine[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            engine[key.strip()] = raw
    if args.prompts:
        engine["prompts_file"] = args.prompts
    raw = {
        "hardware": args.hardware, "target_model": args.target_model, "model_path": args.model_path,
        "method": args.method, "draft_model": args.draft_model, "draft_model_path": args.draft_model_path,
        "num_speculative_tokens": args.num_speculative_tokens, "structures": split(args.structures, str),
        "temperatures": split(args.temperatures, float), "batch_sizes": split(args.batch_sizes, int),
        "prompts_per_structure": args.prompts_per_structure, "max_tokens": args.max_tokens,
        "probes": split(args.probes, str), "engine": engine, "pool_earlier_runs": args.pool_earlier_runs,
    }
    from advisor.schemas import CalibrationRequestSchema

    return CalibrationRequestSchema().load({k: v for k, v in raw.items() if v is not None})


class ProgressSink:
    """Passes updates on and drives a tqdm bar from their progress and message."""

    def __init__(self, inner: Any) -> None:
        from tqdm import tqdm

        self.inner = inner
        self.bar = tqdm(total=100, unit="%", file=sys.stderr, bar_format="{l_bar}{bar}| {elapsed}")

    def record(self, update: dict[str, Any]) -> None:
        self.inner.record(update)
        if "progress" in update:
            self.bar.n = round(100 * update["progress"])
        if update.get("message"):
            self.bar.set_description(str(update["message"])[:50])
        self.bar.refresh()

    def specs(self, request: dict[str, Any]) -> Any:
        return self.inner.specs(request)

    def earlier_runs(self, request: dict[str, Any]) -> Any:
        return self.inner.earlier_runs(request)

    def close(self) -> None:
        self.bar.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="advisor calibrate", description=__doc__)
    add_cli_args(parser)
    args = parser.parse_args(argv)
    from marshmallow import ValidationError

    try:
        request = request_from_args(args)
    except ValidationError as exc:
        parser.error(json.dumps(exc.messages))
    if args.server:
        if not args.token:
            parser.error("--server needs --token")
        uploader = HttpSink(args.server, args.token, run_id=0)
        run = uploader.call("POST", "/v1/calibrations", {**request, "external": True})
        uploader.run_id = run["id"]
        sink = ProgressSink(uploader)
        try:
            status = execute(request, sink, timeout_s=args.timeout)
        finally:
            sink.close()
        print(f"calibration run {run['id']}: {status} — {args.server.rstrip('/')}/v1/calibrations/{run['id']}/report")
        return 0 if status == "succeeded" else 1
    from sqlalchemy.engine import make_url

    from advisor import create_app
    from advisor.services import calibrations

    app = create_app()
    with app.app_context():
        run = calibrations.create(request, external=True)
        sink = ProgressSink(DbSink(run.id))
        try:
            status = execute(request, sink, timeout_s=args.timeout)
        finally:
            sink.close()
        where = make_url(app.config["SQLALCHEMY_DATABASE_URI"]).render_as_string(hide_password=True)
        print(f"calibration run {run.id}: {status} (stored in {where}); "
              f"see /v1/calibrations/{run.id}/report")
    return 0 if status == "succeeded" else 1
