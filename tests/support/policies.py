"""The small policy most service tests need: the hosted simulator, one priced model,
and tenants with their keys and whatever limits or budgets the test is about."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.auth.keys import key_digest


def single_model_policy(hosted: str, tenants: Mapping[str, tuple[str, str]]) -> str:
    """`tenants`: name -> (raw API key, extra YAML flow fields such as `limits: {rpm: 5}`)."""
    lines = [
        "version: 1",
        "upstreams:",
        f'  hosted: {{kind: openai, base_url: "{hosted}/v1"}}',
        "models:",
        "  gpt-4o-mini: {upstream: hosted, price: {input: 0.15, output: 0.60}}",
        "tenants:",
    ]
    for name, (key, extra) in tenants.items():
        fields = f'api_keys: ["{key_digest(key)}"]' + (f", {extra}" if extra else "")
        lines.append(f"  {name}: {{{fields}}}")
    return "\n".join(lines) + "\n"


def alias_bomb(levels: int) -> str:
    """A YAML "alias bomb": `levels` lines of nine aliases each, 9**levels values from a
    few hundred bytes."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefghijklmnopqrstuvwxyz", "bcdefghijklmnopqrstuvwxyz"[:levels - 1], strict=False):
        lines.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"
