#!/bin/bash
# On the lent GPU machine, after scripts/gpu-setup.sh: the GPU closed loop's phases in WORKDIR (default /tmp/w),
# each bounded in time; what they wrote is copied to $OUT at the end (a phase cut short by its bound resumes on the
# next call: `measure` skips the engines it has measured). Usage: scripts/gpu-closed-loop.sh PHASE[:SECONDS] ...
#   e.g. scripts/gpu-closed-loop.sh calibrate:300 measure:240      then      measure:400 analyze:60
# Phase draft_host: benchmarks/draft_host.py; DRAFTERS=a,b,c times those catalog draft models in turn (BATCHES, STARTS).
# TP=2 sets every engine's tensor-parallel size; ONLY=baseline,ngram-k3
# limits `measure` to those engines; DRAFTER=eagle-llama-3.1-8b times that catalog drafter instead of the 1B draft model;
# SECOND_K=5 also times the drafter's cycles at k = 5 in the calibration; CYCLE_TOKENS=128 times whole cycles over
# generations of that many tokens; VERIFY_PER_K=1 gives each verify k its own engine; QUANT=fp8 quantizes the
# target in every engine (calibrate and measure; the drafter stays bf16). PRESPAWN=0: the calibration spawns each
# next start group's engine processes only once the current group is gone (ProbeConfig.prespawn_groups, on on GPUs).
# PROMPT_TOKENS=4096 BATCHES=1,4,16,64 measure at that prompt length and those batch sizes (a long context: every
# step reads a long KV cache). TARGET_MODEL=qwen3-32b measures that catalog target's shape (with
# DRAFTER=qwen3-0.6b: a drafter of its vocabulary), priced by a profile. STEADY=1: `measure` serves B requests in
# flight at each B, each replaced as it finishes (steady.jsonl; benchmarks/gpu_steady_state.py).
# Phases kv-auto, kv-fp8: the plan's target engine alone at an 8k context, decode at B = 1, 8, 32, with that KV-cache
# dtype (benchmarks/kv_cache_dtype.py; the long steps split a profile's per-step overhead from its HBM efficiency).
# On hosts of several GPUs, NVLink multicast stays off (shared hosts: the device's KINDS.md): NCCL's NVLS, torch's
# symmetric-memory multicast, and vLLM's all-reduces that build on them (symmetric memory, FlashInfer's); TP runs
# use vLLM's custom all-reduce (CUDA IPC) and NCCL.
set -u
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
  VLLM_ALLOW_INSECURE_SERIALIZATION=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0 VLLM_ALLREDUCE_USE_FLASHINFER=0
W=${WORKDIR:-/tmp/w}; mkdir -p "$W"
for arg in "$@"; do
  phase=${arg%%:*}; limit=${arg#*:}; [ "$limit" = "$arg" ] && limit=600
  echo "== $phase (limit ${limit}s) at $(date +%T)"
  cmd=(python3 -m benchmarks.gpu_closed_loop "$phase" --workdir "$W")
  case $phase in
    analyze) cmd+=(--out-json "$W/closed-loop-result.json") ;;
    calibrate) cmd+=(--tp "${TP:-1}" --drafter "${DRAFTER:-llama-3.2-1b-instruct}")
               [ -n "${SECOND_K:-}" ] && cmd+=(--second-cycle-k "$SECOND_K")
               [ -n "${CYCLE_TOKENS:-}" ] && cmd+=(--cycle-tokens "$CYCLE_TOKENS")
               [ -n "${VERIFY_PER_K:-}" ] && cmd+=(--verify-per-k)
               [ -n "${QUANT:-}" ] && cmd+=(--quantization "$QUANT")
               [ "${PRESPAWN:-}" = 0 ] && cmd+=(--set prespawn_groups=false) ;;
    measure) cmd+=(--tp "${TP:-1}" --drafter "${DRAFTER:-llama-3.2-1b-instruct}"); [ -n "${ONLY:-}" ] && cmd+=(--only "$ONLY")
             [ -n "${TARGET_MODEL:-}" ] && cmd+=(--target "$TARGET_MODEL")
             [ -n "${QUANT:-}" ] && cmd+=(--quantization "$QUANT")
             [ -n "${PROMPT_TOKENS:-}" ] && cmd+=(--prompt-tokens "$PROMPT_TOKENS")
             [ -n "${BATCHES:-}" ] && cmd+=(--batch-sizes "$BATCHES")
             [ -n "${STEADY:-}" ] && cmd+=(--steady) ;;
    draft_host) if [ -n "${DRAFTERS:-}" ]; then
                  cmd=(python3 -m benchmarks.draft_host --workdir "$W/dh" --out "$W/draft-layers.json"
                       --drafters "$DRAFTERS" --batch-sizes "${BATCHES:-1}" --starts "${STARTS:-1}"
                       --seconds "${SECONDS_PER_START:-100}" --speed-probe 15)
                else cmd=(python3 -m benchmarks.draft_host --workdir "$W/dh" --out "$W/draft-host.json"); fi ;;
    kv-auto|kv-fp8) cmd=(python3 -m benchmarks.gpu_closed_loop calibrate --workdir "$W/$phase" --only target
               --set context_len=8192 --set 'batch_sizes=[1,8,32]' --set 'cycle_batch_sizes=[1,8,32]'
               --set 'prompt_lengths=[8192]' --set 'prefill_batch_sizes=[1]' --set "kv_cache_dtype=\"${phase#kv-}\"") ;;
  esac
  timeout --signal=INT --kill-after=20 "$limit" "${cmd[@]}" \
    2> >(tee -a "$W/$phase.err" | grep -E '^\[(calibrate|measure)|^\{|Error' >&2)
  echo "== $phase exit $? at $(date +%T)"
done
grep -hE "torch.compile take|Graph capturing finished|init engine|Compil(ing|ation) .*took|Loading weights took|Model loading took" \
  "$W"/*.err 2>/dev/null | sed -E 's/^.*(INFO|WARNING)/\1/' | head -80 > "$W/startup-log.txt"
grep -h '^\[calibrate' "$W/calibrate.err" > "$W/calibrate-progress.txt" 2>/dev/null
O="$OUT/${OUTSUB:-w}"  # OUTSUB: another folder under $OUT (two workdirs in one call)
mkdir -p "$O" && cp "$W"/*.json "$W"/*.jsonl "$W"/*.txt "$O/" 2>/dev/null
gzip -c "$W/calibrate.err" > "$O/calibrate.err.gz" 2>/dev/null
for kv in "$W"/kv-*/; do  # at most 8 files come back from a call: the long-step runs travel as one archive
  [ -f "$kv/calibration-redo.jsonl" ] || continue; k=$(basename "$kv")
  mkdir -p "$W/kv"; cp "$kv/calibration-redo.jsonl" "$W/kv/$k.jsonl"
  cp "$kv/calibration-redo-run.json" "$W/kv/$k-run.json"; gzip -c "$W/$k.err" > "$W/kv/$k.err.gz"
done
[ -d "$W/kv" ] && tar czf "$O/kv.tar.gz" -C "$W/kv" .
ls -la "$O"
