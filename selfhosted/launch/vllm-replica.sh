#!/usr/bin/env bash
# Start one vLLM replica of the gateway's pool with the flags the gateway relies on.
# Every setting comes from the environment (POOL_* names: vLLM reads many VLLM_*
# variables itself, and VLLM_PORT in particular is NOT the HTTP port).
#
#   POOL_MODEL=Qwen/Qwen2.5-7B-Instruct POOL_SERVED_NAME=qwen-7b \
#   POOL_PORT=8000 CUDA_VISIBLE_DEVICES=0 selfhosted/launch/vllm-replica.sh
#
# Two replicas on one two-GPU host: run it twice with CUDA_VISIBLE_DEVICES=0 / =1 and
# POOL_PORT=8000 / 8001, then list both URLs under the pool's `replicas:` in the policy.
#
#   POOL_MODEL                   Hugging Face id or local path of the weights (required)
#   POOL_SERVED_NAME             name clients and the policy use; default: POOL_MODEL.
#                                The policy's `upstream_model:` (or the model key) must match it.
#   POOL_HOST, POOL_PORT         listen address; default 0.0.0.0:8000
#   POOL_GPU_MEMORY_UTILIZATION  share of GPU memory for weights + KV cache; default 0.90
#   POOL_MAX_MODEL_LEN           context length cap; default: the model's own
#   POOL_TENSOR_PARALLEL_SIZE    GPUs per replica; default 1
#   POOL_PREFIX_CACHING          1 (default) keeps automatic prefix caching on; 0 turns it off
#   POOL_LOAD_TRACKING           1 (default) adds --enable-server-load-tracking (/load);
#                                0 drops it for a vLLM build that lacks the flag
#   POOL_FORCE_INCLUDE_USAGE     1 adds --enable-force-include-usage (usage on every
#                                response even if the client did not ask); default 0
#   POOL_EXTRA_ARGS              more `vllm serve` arguments, split on spaces
#   VLLM_API_KEY                 read by vLLM itself: clients must then send this bearer key
#                                (set the pool upstream's `api_key_env` to a variable holding it)
#   POOL_DRY_RUN                 1 prints the command instead of running it
set -euo pipefail

: "${POOL_MODEL:?set POOL_MODEL to the model to serve (a Hugging Face id or a local path)}"
served_name="${POOL_SERVED_NAME:-$POOL_MODEL}"

args=(
  serve "$POOL_MODEL"
  --host "${POOL_HOST:-0.0.0.0}"
  --port "${POOL_PORT:-8000}"
  --served-model-name "$served_name"
  --gpu-memory-utilization "${POOL_GPU_MEMORY_UTILIZATION:-0.90}"
  --tensor-parallel-size "${POOL_TENSOR_PARALLEL_SIZE:-1}"
  # usage.prompt_tokens_details.cached_tokens: without it the gateway cannot see (or
  # bill at the cached rate) the tokens the prefix cache served.
  --enable-prompt-tokens-details
)

# Automatic prefix caching is on by default in the V1 engine; say so explicitly so a
# changed default cannot silently turn it off. The gateway's per-tenant `cache_salt`
# keeps tenants from sharing (or timing) each other's cached blocks.
if [[ "${POOL_PREFIX_CACHING:-1}" == "1" ]]; then
  args+=(--enable-prefix-caching)
else
  args+=(--no-enable-prefix-caching)
fi
if [[ "${POOL_LOAD_TRACKING:-1}" == "1" ]]; then
  args+=(--enable-server-load-tracking)
fi
if [[ "${POOL_FORCE_INCLUDE_USAGE:-0}" == "1" ]]; then
  args+=(--enable-force-include-usage)
fi
if [[ -n "${POOL_MAX_MODEL_LEN:-}" ]]; then
  args+=(--max-model-len "$POOL_MAX_MODEL_LEN")
fi
if [[ -n "${POOL_EXTRA_ARGS:-}" ]]; then
  read -r -a extra <<<"$POOL_EXTRA_ARGS"
  args+=("${extra[@]}")
fi

if [[ "${POOL_DRY_RUN:-0}" == "1" ]]; then
  printf '%q ' vllm "${args[@]}"
  printf '\n'
  exit 0
fi
exec vllm "${args[@]}"
