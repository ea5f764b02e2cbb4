"""`gateway demo` as a new user runs it: the printed key and snippet work as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import openai

from tests.support.processes import free_port


def test_demo_prints_a_working_key_and_base_url(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", str(ports[0]), "--hosted-port", str(ports[1]), "--vllm-port", str(ports[2])],
        env={**os.environ, "GATEWAY_VAR_DIR": str(tmp_path / "var")}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        banner = ""
        deadline = time.monotonic() + 30
        assert proc.stdout is not None
        while "Press Ctrl-C" not in banner:
            assert time.monotonic() < deadline and proc.poll() is None, banner
            banner += proc.stdout.readline()
        base_url = re.search(r"base URL : (\S+)", banner).group(1)  # type: ignore[union-attr]
        key = re.search(r"API key  : (\S+)", banner).group(1)  # type: ignore[union-attr]
        assert f'OpenAI(base_url="{base_url}", api_key="{key}")' in banner
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=5)
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello"}])
        assert reply.choices[0].message.content
        pooled = client.chat.completions.create(model="pool-model", messages=[{"role": "user", "content": "Hello"}])
        assert pooled.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(15)
