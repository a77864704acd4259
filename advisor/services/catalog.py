"""Catalog service: GPUs and models in the DB, turned into the cost model's specs."""
from __future__ import annotations

import dataclasses
import json
import time
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flask import current_app

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from .. import costmodel
from ..costmodel.types import minor_version
from ..errors import ApiError, field_error, find_unstorable, loads_bounded
from ..extensions import db
from ..models import Gpu, Model


def list_gpus() -> list[Gpu]:
    return list(db.session.scalars(select(Gpu).order_by(Gpu.name)))


def list_models(kind: str | None = None, family: str | None = None) -> list[Model]:
    query = select(Model).order_by(Model.name)
    if kind:
        query = query.where(Model.kind == kind)
    if family:
        query = query.where(Model.family == family)
    return list(db.session.scalars(query))


def find_gpu(name: str) -> Gpu | None:
    return db.session.scalar(select(Gpu).where(Gpu.name == name))


def find_model(name: str) -> Model | None:
    return db.session.scalar(select(Model).where(Model.name == name))


def get_gpu(name: str) -> Gpu:
    row = find_gpu(name)
    if row is None:
        raise ApiError(404, f"No GPU named '{name}' in the catalog.")
    return row


def get_model(name: str) -> Model:
    row = find_model(name)
    if row is None:
        raise ApiError(404, f"No model named '{name}' in the catalog.")
    return row


# Catalog rows read for answers, cached per process for a few seconds (SPECADVISOR_CATALOG_CACHE_S): a POST
# otherwise spends more time fetching its GPU and models than the cost model spends answering. A change made
# through this process clears the cache at once; other workers see it when their entry expires.
_SNAPSHOTS: dict[tuple[Any, str, str], tuple[float, SimpleNamespace]] = {}
_MAX_SNAPSHOTS = 4096


def _snapshot(cls: type, name: str) -> SimpleNamespace | None:
    """The row's column values (a plain object, safe to share between sessions and threads), or None."""
    key, now = (db.engine.url, cls.__tablename__, name), time.monotonic()
    hit = _SNAPSHOTS.get(key)
    ttl = current_app.config.get("CATALOG_CACHE_S", 5.0)
    if hit is not None and now - hit[0] < ttl:
        return hit[1]
    # a connection of its own, back in the pool at once: the request's session would keep one until the request
    # ended, and a POST's INSERT then needs a second (under load the pool ran dry when the cache expired)
    with db.engine.connect() as connection:
        row = connection.execute(select(cls.__table__).where(cls.__table__.c.name == name)).first()
    if row is None:
        return None  # unknown names are not cached: clients choose them
    if len(_SNAPSHOTS) >= _MAX_SNAPSHOTS:
        _SNAPSHOTS.clear()
    snapshot = SimpleNamespace(**row._mapping)
    _SNAPSHOTS[key] = (now, snapshot)
    return snapshot


def forget_snapshots() -> None:
    _SNAPSHOTS.clear()
    _HEADS.clear()


def require_gpu(name: str, field: str = "gpu") -> Gpu:
    """For scenario validation: an unknown GPU is a 422 naming the field and the known names."""
    row = _snapshot(Gpu, name)
    if row is None:
        known = ", ".join(g.name for g in list_gpus())
        raise field_error(field, f"Unknown GPU '{name}'. Known GPUs: {known}.")
    return row


def require_model(name: str, field: str) -> Model:
    row = _snapshot(Model, name)
    if row is None:
        raise field_error(field, f"Unknown model '{name}'. See GET /v1/models for the catalog.")
    return row


@lru_cache(maxsize=1)
def engine_profiles() -> tuple[costmodel.MeasuredEngineProfile, ...]:
    """The measured GPU × vLLM profiles shipped in ``advisor/data/engine_profiles.json``."""
    path = Path(__file__).resolve().parent.parent / "data" / "engine_profiles.json"
    if not path.exists():
        return ()
    return tuple(costmodel.MeasuredEngineProfile.from_dict(p) for p in json.loads(path.read_text())["items"])


@lru_cache(maxsize=1)
def _profiled_gpus() -> dict[str, costmodel.GpuSpec]:
    """The packaged catalog's specs of the GPUs the shipped profiles were measured on (as measured, whatever a user
    later edits in the catalog)."""
    from ..storage import catalog_items

    names = {p.gpu for p in engine_profiles()}
    return {g["name"]: costmodel.GpuSpec.from_dict(g) for g in catalog_items("gpus") if g["name"] in names}


@lru_cache(maxsize=256)
def engine_profile_for(gpu: costmodel.GpuSpec, vllm_version: str | None) -> costmodel.MeasuredEngineProfile | None:
    """The shipped profile that times ``gpu`` × ``vllm_version``: its own, else that version's carried to it from
    the nearest measured GPU (:func:`advisor.costmodel.matching_profile`), else None. Cached by the GPU's specs (an
    edited catalog row is another key): carrying profiles is 20-45 µs that every POST naming a version paid."""
    return costmodel.matching_profile(engine_profiles(), gpu, vllm_version, _profiled_gpus())


def answer_profile(gpu: costmodel.GpuSpec, vllm_version: str | None,
                   run: costmodel.Calibration | None) -> costmodel.MeasuredEngineProfile | None:
    """The profile an answer (a recommendation, a plan's GPU) is timed by: that of the vLLM version named, else of
    the one ``run``, the node's calibration, recorded (the answer is for that node). It times the GPU where no run
    did, and a drafter of a method the run did not time (on an H100, EAGLE-3 after a draft-model run: 18.7 % off
    with the head's prior, 7.3 % with the profile; docs/gpu-closed-loop.md, "Run 22")."""
    return engine_profile_for(gpu, vllm_version or (run.vllm_version if run is not None else None))


def engine_profile_view(profile: costmodel.MeasuredEngineProfile) -> dict[str, Any]:
    """A profile as ``GET /v1/engine-profiles`` shows it: what an answer says of it, and its measured timing."""
    step, pre = profile.step_time, profile.prefill
    return {**costmodel.profile_summary(profile), "max_batch_measured": profile.max_batch_measured,
            "step_time": {"fixed_overhead_ms": 1e3 * step.fixed_overhead_s,
                          "bandwidth_efficiency": step.bandwidth_efficiency,
                          "compute_efficiency": step.compute_efficiency,
                          "verify_overhead_ms": 1e3 * step.verify_overhead_s,
                          "proposer_overhead_ms": 1e3 * step.proposer_overhead_s,
                          "ragged_step_ms": 1e3 * step.ragged_step_s, "timing_rms_rel": step.timing_rms_rel},
            "prefill": {"fixed_overhead_ms": 1e3 * pre.fixed_overhead_s, "compute_efficiency": pre.compute_efficiency}}


def list_engine_profiles(gpu: str | None = None, vllm_version: str | None = None) -> list[dict[str, Any]]:
    """The shipped profiles (of ``vllm_version``); with ``gpu``, the one that times that catalog GPU for each shipped
    version (its own, or one carried to it), as an answer naming that version gets it."""
    if gpu is None:
        wanted = minor_version(vllm_version)
        return [engine_profile_view(p) for p in engine_profiles() if wanted in (None, p.vllm_version)]
    spec = gpu_spec(require_gpu(gpu))
    versions = [vllm_version] if vllm_version else sorted({p.vllm_version for p in engine_profiles()})
    return [engine_profile_view(p) for p in (engine_profile_for(spec, v) for v in versions) if p is not None]


HEAD_METHODS = {"eagle_head": "eagle", "eagle3_head": "eagle3", "mtp_head": "mtp"}
MIN_DRAFT_RATIO = 5.0  # a causal-LM drafter at least this much smaller than the target (checks.py: usual 10-50×)
MAX_DEFAULT_DRAFTERS = 3


def speculator_candidates(target: costmodel.ModelSpec) -> list[dict[str, Any]]:
    """What a plan or a recommendation tries when none is named: n-gram, then the catalog drafters that share the
    target's tokenizer, heads first, then small causal LMs (the largest first: it accepts most)."""
    heads, lms = [], []
    for row in list_models():
        spec = model_spec(row)
        if spec.name == target.name:
            continue
        method = HEAD_METHODS.get(spec.kind) or ("draft_model" if spec.kind == "causal_lm" else None)
        if method is None or any(i.severity == "error" for i in costmodel.check_draft(target, spec, method)):
            continue
        if spec.kind != "causal_lm":
            heads.append({"method": method, "draft_model": spec.name})
        elif target.param_count / max(spec.param_count, 1) >= MIN_DRAFT_RATIO:
            lms.append((spec.param_count, {"method": method, "draft_model": spec.name}))
    lms.sort(key=lambda x: -x[0])
    return [{"method": "ngram"}] + (heads + [d for _, d in lms])[:MAX_DEFAULT_DRAFTERS]


# The catalog's heads per target, cached per process for a few seconds as the rows are (CATALOG_CACHE_S).
_HEADS: dict[tuple[Any, costmodel.ModelSpec], tuple[float, dict[str, costmodel.ModelSpec]]] = {}


def compared_heads(target: costmodel.ModelSpec) -> dict[str, costmodel.ModelSpec]:
    """The catalog's EAGLE and EAGLE-3 head for ``target`` (:func:`advisor.costmodel.compared_heads`), which an
    answer's compared methods are priced with."""
    key, now = (db.engine.url, target), time.monotonic()
    hit = _HEADS.get(key)
    if hit is not None and now - hit[0] < current_app.config.get("CATALOG_CACHE_S", 5.0):
        return hit[1]
    with db.engine.connect() as connection:  # its own connection, back in the pool at once (see _snapshot)
        rows = connection.execute(select(Model.__table__).where(
            Model.kind.in_(tuple(costmodel.HEAD_KINDS)))).all()
    heads = costmodel.compared_heads(target, (_spec(costmodel.ModelSpec, SimpleNamespace(**row._mapping))
                                              for row in rows))
    if len(_HEADS) >= _MAX_SNAPSHOTS:
        _HEADS.clear()
    _HEADS[key] = (now, heads)
    return heads


def _spec(cls: type, row: Any) -> Any:
    """The cost model's spec of a catalog row; a cached snapshot (never changed) keeps its spec, built once."""
    snapshot = isinstance(row, SimpleNamespace)
    spec = row.__dict__.get("_spec") if snapshot else None
    if type(spec) is not cls:
        spec = cls(**{f.name: getattr(row, f.name) for f in dataclasses.fields(cls)})
        if snapshot:
            row._spec = spec
    return spec


def gpu_spec(row: Gpu) -> costmodel.GpuSpec:
    return _spec(costmodel.GpuSpec, row)


def model_spec(row: Model) -> costmodel.ModelSpec:
    return _spec(costmodel.ModelSpec, row)


def _exists(name: str) -> ApiError:
    return ApiError(409, f"'{name}' already exists; use PUT to change it.", fields={"name": ["already exists"]})


def create(cls: type, values: dict[str, Any]) -> Any:
    """Insert a catalog row; the name's unique constraint decides between concurrent creates (one 201, 409s)."""
    if db.session.scalar(select(cls.id).where(cls.name == values["name"])) is not None:
        raise _exists(values["name"])
    row = cls(**values)
    db.session.add(row)
    forget_snapshots()
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise _exists(values["name"]) from None
    return row


def update(row: Any, values: dict[str, Any]) -> Any:
    if "name" in values and values["name"] != row.name:
        raise field_error("name", "The name is the resource's identity and cannot change; create a new entry.")
    for key, value in values.items():
        setattr(row, key, value)
    db.session.commit()
    forget_snapshots()
    return row


# --- Hugging Face config.json import -----------------------------------------------------------------------
def model_from_hf_config(raw: bytes, form: dict[str, Any]) -> dict[str, Any]:
    """Map a Hugging Face ``config.json`` to a catalog row; unknown shapes are a 422 naming the file field."""
    try:
        config = loads_bounded(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise field_error("config", f"Not a JSON file: {exc}.") from None
    if not isinstance(config, dict):
        raise field_error("config", "config.json must hold a JSON object.")
    bad = find_unstorable(config)
    if bad:
        raise field_error("config", f"'{bad}' is not valid UTF-8 text or holds a NUL (0x00) character.")
    text_config = config.get("text_config")
    if text_config is not None and not isinstance(text_config, dict):
        raise field_error("config", "config.json's 'text_config' must be an object.")
    config = {**config, **(text_config or {})}  # multimodal wrappers keep the language model inside
    for key in ("model_type", "_name_or_path"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise field_error("config", f"config.json's '{key}' must be a string.")

    def number(keys: tuple[str, ...], maximum: int, required: bool = True) -> int | None:
        """The first of ``keys`` present, as a positive integer up to ``maximum`` (checked before any arithmetic,
        so a string, a float such as 1e308 or a huge count never reaches the parameter count)."""
        for key in keys:
            value = config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
                raise field_error("config", f"config.json's '{key}' must be an integer from 1 to {maximum}, "
                                            f"got {json.dumps(value)[:40]}.")
            return value
        if required:
            raise field_error("config", f"config.json lacks a positive integer '{keys[0]}'.")
        return None

    layers = number(("num_hidden_layers", "n_layer", "num_layers"), 1000)
    hidden = number(("hidden_size", "n_embd", "d_model"), 1_000_000)
    heads = number(("num_attention_heads", "n_head"), 4096)
    kv_heads = number(("num_key_value_heads",), 4096, required=False) or heads
    head_dim = number(("head_dim",), 4096, required=False) or hidden // heads
    if head_dim < 1:
        raise field_error("config", f"hidden_size ({hidden}) is smaller than num_attention_heads ({heads}).")
    intermediate = number(("intermediate_size", "ffn_dim", "n_inner"), 10_000_000)
    vocab = number(("vocab_size",), 10_000_000)
    experts = number(("num_local_experts", "num_experts", "n_routed_experts"), 4096, required=False)
    experts_per_token = number(("num_experts_per_tok",), experts, required=False) if experts else None
    moe_intermediate = number(("moe_intermediate_size",), 10_000_000, required=False) or intermediate
    window = number(("max_position_embeddings", "n_positions", "max_sequence_length"), 100_000_000, required=False)
    tied = config.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise field_error("config", "config.json's 'tie_word_embeddings' must be true or false.")
    family = form.get("family") or (config.get("model_type") or "unknown")[:64]
    params = param_count_from_architecture(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=moe_intermediate if experts else intermediate, vocab_size=vocab,
        tie_word_embeddings=tied, num_experts=experts)
    return {
        "name": form["name"], "family": family, "kind": form.get("kind", "causal_lm"),
        "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv_heads,
        "head_dim": head_dim, "intermediate_size": intermediate, "vocab_size": vocab,
        "tie_word_embeddings": tied, "num_experts": experts, "num_experts_per_token": experts_per_token,
        "param_count": params, "tokenizer_family": form.get("tokenizer_family") or family,
        "tokenizer_vocab_size": vocab, "tokenizer_hash": form.get("tokenizer_hash"),
        "hf_repo": form.get("hf_repo") or (config.get("_name_or_path") or "")[:200] or None,
        "max_position_embeddings": window,
        "source": form.get("source") or "uploaded Hugging Face config.json",
    }


def param_count_from_architecture(*, num_layers: int, hidden_size: int, num_attention_heads: int,
                                  num_kv_heads: int, head_dim: int, intermediate_size: int, vocab_size: int,
                                  tie_word_embeddings: bool, num_experts: int | None = None) -> int:
    """Parameters of a llama-style decoder (gated MLP, RMSNorm, no biases); llama-3.1-8b gives 8.03e9."""
    attention = hidden_size * head_dim * (num_attention_heads + 2 * num_kv_heads) \
        + num_attention_heads * head_dim * hidden_size  # q, k, v, o projections
    mlp = 3 * hidden_size * intermediate_size * (num_experts or 1)  # gate, up, down (per expert)
    router = hidden_size * num_experts if num_experts else 0
    per_layer = attention + mlp + router + 2 * hidden_size  # two RMSNorm weights
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    return num_layers * per_layer + embeddings + hidden_size  # final norm
