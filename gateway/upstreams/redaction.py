"""What an upstream's error message must lose before a tenant sees it: the gateway's own
credentials, anything shaped like a credential, URLs, and host names or addresses with
their ports. A provider behind a proxy or a load balancer often names its internal
endpoints in its errors; those are for the operator (the log, the ledger), not for the
tenant.

Pure text functions: no I/O, nothing from the rest of the package.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SECRET = "[redacted]"
URL = "[redacted url]"
HOST = "[redacted host]"

# scheme://anything up to whitespace or a quote; trailing sentence punctuation is kept.
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s\"'<>`]+")
_URL_TAIL = ".,;:!?)]}"

# `name: value` / `name=value` where the name says the value is secret.
_NAMED_SECRET = re.compile(
    r"(?i)\b(authorization|proxy-authorization|x-api-key|api[-_]?key|access[-_]?token|auth[-_]?token|refresh[-_]?token"
    r"|id[-_]?token|client[-_]?secret|secret|password|passwd)"
    r"([\"']?\s*[:=]\s*[\"']?)"
    r"((?:(?:bearer|basic|token)\s+)?[^\s\"',;&)\]}]+)"
)
_TOKENS = re.compile(
    r"(?i:\bbearer\s+[\w.~+/=\-]+)"  # an Authorization value on its own (RFC 6750's token characters)
    r"|\bsk-[\w\-*]{6,}"  # OpenAI, Anthropic, DeepSeek...; masked ones too (sk-proj-****abcd)
    r"|\b(?:key|pk|rk|gsk|xai|hf|ghp|gho|ghu|ghs|ghr|glpat|github_pat)[-_][A-Za-z0-9_\-]{12,}"
    r"|\beyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]*"  # a JWT
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # an AWS access key id
    r"|\bAIza[\w\-]{35}"  # a Google API key
)

_PORT = r"(?::\d{1,5})?"
# Not followed by more of a name or number ("1.2.3.4.5", "phi3:3.8b"); a full stop that
# ends the sentence is fine.
_END = r"(?!\.?[\w:-])"
_IPV6_BRACKETED = re.compile(r"\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\]" + _PORT)
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}" + _PORT + _END)
# Bare IPv6 only when unmistakable (has `::`, or all eight groups): "12:30:45" is a time.
_IPV6 = re.compile(r"(?<![\w:.])(?=[0-9A-Fa-f:]*::|(?:[0-9A-Fa-f]{1,4}:){7})(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# Any name with a port ("vllm-0:8000", "gpu-3.pool.internal:443"); it needs a letter,
# or it would be a time of day.
_HOST_PORT = re.compile(rf"(?<![\w.\-])(?:{_LABEL}\.)*(?=[\w-]*[A-Za-z])[A-Za-z0-9-]+:\d{{1,5}}{_END}")
# A dotted name without a port only under a suffix that names hosts: a message is full of
# dotted things that are not (`messages.0.content`, `config.json`, `gpt-3.5-turbo`).
_HOST_SUFFIXES = ("com", "net", "org", "io", "ai", "dev", "app", "cloud", "co", "us", "eu", "uk", "de", "internal", "local",
                  "localdomain", "lan", "corp", "intra", "intranet", "home", "svc", "arpa", "test", "example", "invalid", "private")
_HOST = re.compile(rf"(?i)(?<![\w.\-])(?:{_LABEL}\.)+(?:{'|'.join(_HOST_SUFFIXES)}){_END}|\blocalhost\b")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with the given secret values, credential-like tokens, URLs and hosts
    replaced by markers that say what was there."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, SECRET)
    text = _URL.sub(_url_marker, text)
    text = _NAMED_SECRET.sub(lambda m: f"{m.group(1)}{m.group(2)}{SECRET}", text)
    text = _TOKENS.sub(SECRET, text)
    for pattern in (_IPV6_BRACKETED, _IPV4, _IPV6, _HOST_PORT, _HOST):
        text = pattern.sub(HOST, text)
    return text


def _url_marker(match: re.Match[str]) -> str:
    url = match.group(0)
    kept = url.rstrip(_URL_TAIL)
    return URL + url[len(kept):]
