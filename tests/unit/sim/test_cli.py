"""`gateway sim hosted|vllm` flags reach the simulator configs."""

from __future__ import annotations

import argparse

import pytest

from gateway.sim.cli import add_sim_commands


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sim_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_hosted_flags_and_defaults() -> None:
    args = parse("sim", "hosted", "--rpm", "5", "--fail-429-rate", "0.5", "--model", "a", "--model", "b")
    assert (args.port, args.host, args.rpm, args.tpm, args.fail_429_rate, args.model) == (9100, "127.0.0.1", 5, None, 0.5, ["a", "b"])
    assert callable(args.func)


def test_vllm_flags_and_defaults() -> None:
    args = parse("sim", "vllm", "--enable-prompt-tokens-details", "--decode-s-per-token", "0.01")
    assert (args.port, args.model, args.block_size, args.enable_prompt_tokens_details) == (9200, "pool-model", 16, True)
    assert args.decode_s_per_token == 0.01 and callable(args.func)


def test_hosted_tokenizer_ratio_is_a_positive_number() -> None:
    assert parse("sim", "hosted").tokens_per_tiktoken == 1.0
    assert parse("sim", "hosted", "--tokens-per-tiktoken", "2.0").tokens_per_tiktoken == 2.0
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            parse("sim", "hosted", "--tokens-per-tiktoken", bad)
