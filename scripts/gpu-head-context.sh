#!/bin/bash
# On the lent GPU machine, after scripts/gpu-setup.sh: the EAGLE-3 head's engine and the plain target at longer
# contexts and larger batches than the plan's (docs/gpu-closed-loop.md, "The profiles out of sample"), each part
# bounded in time; every part's records, run summary and progress go to $OUT/<part>.
# Parts: c1024 (B = 1-256 at a 1k context), c4096 (B = 1-64 at 4k), ngram1024 (n-gram's cycles, V1 path, B = 1-64
# at 1k), wide (plain steps of 256-1,024 sequences at the plan's 128 tokens).
# Usage: scripts/gpu-head-context.sh PART[:SECONDS] ...   (2026-12-07: c1024 then c4096:230 wide:165 ngram1024:165)
set -u
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
  VLLM_ALLOW_INSECURE_SERIALIZATION=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for arg in "$@"; do
  part=${arg%%:*}; limit=${arg#*:}; [ "$limit" = "$arg" ] && limit=560
  W=/tmp/hc/$part; mkdir -p "$W"
  common=(--set long_context_len=null --set sampled_temperature=null --set 'prefill_batch_sizes=[1]')
  case $part in
    c1024) set_=(--only target,eagle3 --set context_len=1024 --set 'batch_sizes=[1,16,64,256]'
                 --set 'cycle_batch_sizes=[1,16,64,256]' --set 'prompt_lengths=[1024]') ;;
    c4096) set_=(--only target,eagle3 --set context_len=4096 --set 'batch_sizes=[1,16,64]'
                 --set 'cycle_batch_sizes=[1,16,64]' --set 'prompt_lengths=[4096]') ;;
    ngram1024) set_=(--only ngram --set context_len=1024 --set 'batch_sizes=[1,16,64]'
                     --set 'cycle_batch_sizes=[1,16,64]' --set 'prompt_lengths=[1024]') ;;
    wide) set_=(--only target --set 'batch_sizes=[256,512,1024]' --set 'prompt_lengths=[512]') ;;
    *) echo "unknown part $part"; continue ;;
  esac
  echo "== $part (limit ${limit}s) at $(date +%T)"
  timeout --signal=INT --kill-after=20 "$limit" python3 -m benchmarks.gpu_closed_loop calibrate --workdir "$W" \
    --drafter eagle3-llama-3.1-8b "${set_[@]}" "${common[@]}" 2> "$W/calibrate.err"
  echo "== $part exit $? at $(date +%T)"
  grep -h '^\[calibrate' "$W/calibrate.err" > "$W/progress.txt"; tail -n 25 "$W/progress.txt"
  grep -E "Error|error" "$W/calibrate.err" | tail -n 5
  mkdir -p "$OUT/$part" && cp "$W"/*.json "$W"/*.jsonl "$W/progress.txt" "$OUT/$part/" 2>/dev/null
done
