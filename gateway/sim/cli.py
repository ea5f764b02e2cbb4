"""`gateway sim hosted|vllm|anthropic`: run a simulator as a real HTTP server until Ctrl-C."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gateway.sim.asgi import ASGIApp


def serve_app(app: ASGIApp, host: str, port: int) -> None:
    import uvicorn  # deferred: only the serving path needs it

    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        lifespan="off",
        log_level="warning",
    )


def _run_hosted(args: argparse.Namespace) -> int:
    from gateway.sim.hosted import HostedSimConfig, create_hosted_app

    config = HostedSimConfig(
        seed=args.seed,
        output_tokens=args.output_tokens,
        token_delay_s=args.token_delay,
        latency_s=args.latency,
        rpm=args.rpm,
        tpm=args.tpm,
        fail_429_rate=args.fail_429_rate,
        require_auth=args.require_auth,
        retry_after_s=args.retry_after,
        fail_5xx_rate=args.fail_5xx_rate,
        cut_stream_rate=args.cut_stream_rate,
        malformed_rate=args.malformed_rate,
        prompt_caching=not args.no_prompt_caching,
        tokens_per_tiktoken=args.tokens_per_tiktoken,
        embedding_dims=args.embedding_dims,
        quality=dict(args.quality_profile or []),
    )
    if args.model:
        config.models = list(args.model)
    return _serve("hosted simulator", create_hosted_app(config, args.usage_file), args)


def _run_anthropic(args: argparse.Namespace) -> int:
    from gateway.sim.anthropic import AnthropicSimConfig, create_anthropic_app

    config = AnthropicSimConfig(
        seed=args.seed,
        output_tokens=args.output_tokens,
        token_delay_s=args.token_delay,
        latency_s=args.latency,
        fail_429_rate=args.fail_429_rate,
        fail_529_rate=args.fail_529_rate,
        retry_after_s=args.retry_after,
        spend_limited=args.spend_limited,
        api_keys=list(args.api_key) if args.api_key else None,
        min_cache_tokens=args.min_cache_tokens,
    )
    if args.model:
        config.models = list(args.model)
    return _serve("Anthropic simulator", create_anthropic_app(config), args)


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _quality_profile(text: str) -> tuple[str, Any]:
    from gateway.sim.quality import parse_profile

    try:
        return parse_profile(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_vllm(args: argparse.Namespace) -> int:
    from gateway.sim.kv_events import parse_kv_events_config
    from gateway.sim.vllm import VllmSimConfig, create_vllm_app

    config = VllmSimConfig(
        model=args.model,
        served_model_names=list(args.served_model_name or []),
        seed=args.seed,
        output_tokens=args.output_tokens,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        enable_prefix_caching=not args.no_enable_prefix_caching,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_force_include_usage=args.enable_force_include_usage,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        prefill_s_per_token=args.prefill_s_per_token,
        decode_s_per_token=args.decode_s_per_token,
        kv_events=parse_kv_events_config(args.kv_events_config) if args.kv_events_config else None,
    )
    return _serve("vLLM simulator", create_vllm_app(config), args)


def _serve(name: str, app: ASGIApp, args: argparse.Namespace) -> int:
    print(f"{name} listening on http://{args.host}:{args.port}", flush=True)
    try:
        serve_app(app, args.host, args.port)
    except KeyboardInterrupt:
        pass
    return 0


def _common(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed: same seed and request, same answer")
    parser.add_argument("--output-tokens", type=int, default=20, help="completion length when the request sets no bound")


def add_sim_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    sim = subparsers.add_parser("sim", help="run an upstream simulator (hosted API, Anthropic or vLLM)")
    kinds = sim.add_subparsers(dest="sim_kind", required=True)

    hosted = kinds.add_parser("hosted", help="OpenAI-compatible hosted API with limits, caching and faults")
    _common(hosted, 9100)
    hosted.add_argument("--model", action="append", help="served model (repeat); default: the built-in list")
    hosted.add_argument("--token-delay", type=float, default=0.0, help="seconds between streamed chunks")
    hosted.add_argument("--latency", type=float, default=0.0, help="seconds before the first token")
    hosted.add_argument("--rpm", type=int, default=None, help="requests per minute per model")
    hosted.add_argument("--tpm", type=int, default=None, help="tokens per minute per model")
    hosted.add_argument("--require-auth", action="store_true", help="answer 401 without a bearer key, as OpenAI does")
    hosted.add_argument("--fail-429-rate", type=float, default=0.0)
    hosted.add_argument("--retry-after", type=float, default=1.0, help="retry-after of injected 429s, seconds")
    hosted.add_argument("--fail-5xx-rate", type=float, default=0.0)
    hosted.add_argument("--cut-stream-rate", type=float, default=0.0)
    hosted.add_argument("--malformed-rate", type=float, default=0.0)
    hosted.add_argument("--no-prompt-caching", action="store_true")
    hosted.add_argument("--tokens-per-tiktoken", type=_positive_float, default=1.0, metavar="RATIO",
                        help="prompt tokens counted (and billed) per tiktoken token: a provider with another tokenizer")
    hosted.add_argument("--embedding-dims", type=int, default=64)
    hosted.add_argument("--usage-file", type=Path, default=None,
                        help="keep the usage report in this file (JSON lines), so it survives a restart")
    hosted.add_argument("--quality-profile", action="append", type=_quality_profile, metavar="MODEL=FAIL,SILENT",
                        help="share of prompts MODEL answers failing a verifiable check / silently wrong (repeat);"
                             " truth at GET /sim/truth/{response id}")
    hosted.set_defaults(func=_run_hosted)

    claude = kinds.add_parser("anthropic", help="Anthropic Messages API with prompt caching, limits, 429/529 and admin reports")
    _common(claude, 9300)
    claude.add_argument("--model", action="append", help="served model (repeat); default: the built-in list")
    claude.add_argument("--token-delay", type=float, default=0.0, help="seconds between streamed deltas")
    claude.add_argument("--latency", type=float, default=0.0, help="seconds before the first token")
    claude.add_argument("--fail-429-rate", type=float, default=0.0)
    claude.add_argument("--fail-529-rate", type=float, default=0.0, help="share of calls answered 529 overloaded_error")
    claude.add_argument("--retry-after", type=float, default=1.0, help="retry-after of injected 429s, seconds")
    claude.add_argument("--spend-limited", action="store_true", help="every call 429s without retry-after (out of credit)")
    claude.add_argument("--api-key", action="append", help="accept only this x-api-key (repeat); default: any")
    claude.add_argument("--min-cache-tokens", type=int, default=1024, help="shortest prefix that is cached")
    claude.set_defaults(func=_run_anthropic)

    vllm = kinds.add_parser("vllm", help="vLLM OpenAI-compatible server with prefix caching and metrics")
    _common(vllm, 9200)
    vllm.add_argument("--model", default="pool-model", help="served model name")
    vllm.add_argument("--served-model-name", action="append", help="served names, replacing --model (repeat)")
    vllm.add_argument("--block-size", type=int, default=16)
    vllm.add_argument("--num-gpu-blocks", type=int, default=4096, help="KV cache capacity in blocks")
    vllm.add_argument("--no-enable-prefix-caching", action="store_true")
    vllm.add_argument("--enable-prompt-tokens-details", action="store_true")
    vllm.add_argument("--enable-force-include-usage", action="store_true")
    vllm.add_argument("--max-num-seqs", type=int, default=64)
    vllm.add_argument("--max-model-len", type=int, default=32768)
    vllm.add_argument("--prefill-s-per-token", type=float, default=0.0)
    vllm.add_argument("--decode-s-per-token", type=float, default=0.0)
    vllm.add_argument("--kv-events-config", metavar="JSON", default=None,
                      help='publish KV events as vLLM does, e.g. {"enable_kv_cache_events": true, "publisher": "zmq",'
                           ' "endpoint": "tcp://*:5557", "topic": "kv"}')
    vllm.set_defaults(func=_run_vllm)
