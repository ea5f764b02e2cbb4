"""An upstream's error message loses URLs, hosts and credentials, and keeps the rest of
what it says (parameter paths, model names, numbers, times)."""

from __future__ import annotations

import pytest

from gateway.upstreams.redaction import HOST, SECRET, URL, redact


@pytest.mark.parametrize(("text", "expected"), [
    ("upstream connect error to http://10.0.3.7:8000/v1/chat/completions: reset.", f"upstream connect error to {URL}: reset."),
    ("see https://user:pw@api.internal.example/v1?key=abc, then retry", f"see {URL}, then retry"),
    ("proxy (http://gw-proxy:3128) refused", f"proxy ({URL}) refused"),
    ("redis://:hunter2@cache-1:6379/0 is down", f"{URL} is down"),
])
def test_urls_go_whole_with_their_credentials_and_queries(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Error 111 connecting to 10.0.0.12:6379. Connection refused.", f"Error 111 connecting to {HOST}. Connection refused."),
    ('connection to server at "192.168.1.20", port 5432 failed', f'connection to server at "{HOST}", port 5432 failed'),
    ("backend [fe80::1]:8443 and [2001:db8::7]:80 down", f"backend {HOST} and {HOST} down"),
    ("no route to 2001:db8:0:0:0:0:0:7 or ::1", f"no route to {HOST} or {HOST}"),
    ("replica vllm-0:8000 is draining", f"replica {HOST} is draining"),
    ("could not reach vllm-0.vllm.default.svc.cluster.local:8000", f"could not reach {HOST}"),
    ("gpu-node-3.pool.internal answered 503", f"{HOST} answered 503"),
    ("upstream api.openai.com timed out", f"upstream {HOST} timed out"),
    ("mail ops@corp.example.com", f"mail ops@{HOST}"),
    ("only localhost and localhost:9000", f"only {HOST} and {HOST}"),
])
def test_hosts_and_addresses_go_with_their_ports(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Incorrect API key provided: sk-proj-abc****************wxyz.", f"Incorrect API key provided: {SECRET}."),
    ("invalid x-api-key sk-ant-api03-AbCdEf123456", f"invalid x-api-key {SECRET}"),
    ("sent (Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl) expired", f"sent ({SECRET}) expired"),
    ("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig is invalid", f"token {SECRET} is invalid"),
    ("api_key=abcd1234efgh; password: hunter22", f"api_key={SECRET}; password: {SECRET}"),
    ('{"Authorization": "Basic dXNlcjpwYXNz"}', f'{{"Authorization": "{SECRET}"}}'),
    ("client_secret='s3cr3t-value' refused", f"client_secret='{SECRET}' refused"),
    ("keys AKIAIOSFODNN7EXAMPLE AIzaSyA1234567890abcdefghijklmnopqrstuv", f"keys {SECRET} {SECRET}"),
    ("tokens hf_abcdefghijklmnopqrstuvwxyz gsk_0123456789abcdefghij key-0123456789abcdef", f"tokens {SECRET} {SECRET} {SECRET}"),
])
def test_credentials_go(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_the_upstreams_own_secrets_go_whatever_their_shape() -> None:
    assert redact("the key 0000-PLAIN-secret-1111 was refused", ["0000-PLAIN-secret-1111"]) == f"the key {SECRET} was refused"
    assert redact("nothing to hide", ["", "absent"]) == "nothing to hide"  # an empty secret redacts nothing


@pytest.mark.parametrize("text", [
    "max_tokens is too large: 5000. This model supports at most 4096 completion tokens.",
    "Invalid type for 'messages[1].content[0].text': expected a string, but got an object instead.",
    "messages.0.content.1.tool_use.id: Field required",
    "Invalid value for 'response_format.json_schema': see config.json and schema.yaml",
    "The model `gpt-3.5-turbo` does not support tools; nor do llama-3.1-8b, phi3:3.8b or qwen2.5:14b.",
    "Rate limit reached for gpt-4o-mini in organization org-abc on tokens per min (TPM): Limit 200000, Used 1. "
    "Please try again in 1.5s.",
    "request req_0123456789abcdef failed at 2026-01-01T10:30:00Z (12:30:45), version 1.2.3, e.g. or i.e. retry",
])
def test_what_is_not_a_url_host_or_credential_stays(text: str) -> None:
    assert redact(text) == text
