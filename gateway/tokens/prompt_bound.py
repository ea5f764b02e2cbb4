"""The most prompt tokens any byte-level tokenizer can count for a request: what a
budget hold must cover when the gateway does not know the provider's tokenizer.

A byte-level BPE token covers at least one byte of the text it encodes, so a text has
no more tokens than UTF-8 bytes - after the tokenizer's normalizer, which can lengthen
it (NFKC spells U+FDFA as 18 letters), hence the longest of its normal forms. On
top of the texts, a chat template adds special tokens and text of its own; the
constants below are that allowance, stated generously:

- `TEMPLATE_TOKENS` once per chat request: begin/end markers, reply priming, a default
  system prompt (Llama 3.1 adds dates, Qwen 2.5 an identity; some run to a few hundred
  tokens);
- `MESSAGE_TOKENS` per message: role headers and end-of-turn markers (about 5 in
  ChatML, Llama 3 and Gemma);
- `TOOLS_TOKENS` when tools are given: the instructions templates wrap them in (under
  100 tokens in Llama 3.1's and Qwen 2.5's);
- `INPUT_TOKENS` per text prompt or embedding input: BOS/EOS, CLS/SEP.

What a chat request's provider may render is taken from the whole body's JSON (messages,
names, tool calls and their arguments, fields a template may know such as `documents`),
and definitions templates pretty-print - `tools`, `functions`, `response_format` - count
again at twice their indented JSON (at least their four-space-indented length). Images,
audio and files are priced by providers in units of their own that no byte count bounds.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import orjson

from gateway.errors import InvalidRequest

TEMPLATE_TOKENS = 512
MESSAGE_TOKENS = 16
TOOLS_TOKENS = 512
INPUT_TOKENS = 16
# Re-rendered by templates as indented JSON: twice the 2-space-indented length bounds
# the 4-space one (the extra indentation is at most what the 2-space form adds).
DEFINITIONS = ("tools", "functions", "response_format")


def prompt_tokens_bound(endpoint: str, body: dict[str, Any]) -> int:
    """No byte-level tokenizer, under any of the chat templates allowed for above,
    counts more prompt tokens for `body` than this."""
    if endpoint in ("chat.completions", "messages", "messages.count_tokens"):  # Anthropic's system is in the body's JSON too
        return _chat_bound(body)
    value = body.get("prompt") if endpoint == "completions" else body.get("input")
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return len(value)  # one input given as token ids: the provider's own tokens
    items = value if isinstance(value, list) else [value]
    total = sum(_text_bound(item) if isinstance(item, str) else len(item) if isinstance(item, list) else 0
                for item in items)
    suffix = body.get("suffix") if endpoint == "completions" else None
    return total + (_text_bound(suffix) if isinstance(suffix, str) else 0)


def _chat_bound(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    total = TEMPLATE_TOKENS + _json_bytes(body, 0)
    total += MESSAGE_TOKENS * (len(messages) if isinstance(messages, list) else 0)
    if body.get("tools") or body.get("functions"):
        total += TOOLS_TOKENS
    for name in DEFINITIONS:
        if body.get(name):
            total += 2 * _json_bytes(body[name], orjson.OPT_INDENT_2)
    return total


def _text_bound(text: str) -> int:
    return INPUT_TOKENS + (len(text) if text.isascii() else _longest_form(text.encode("utf-8", "surrogatepass")))


def _json_bytes(value: Any, option: int) -> int:
    try:
        data = orjson.dumps(value, option=option)
    except orjson.JSONEncodeError as exc:  # deeper than orjson writes: the body could not be forwarded either
        raise InvalidRequest(f"the request body cannot be sent on: {exc}") from exc
    return len(data) if data.isascii() else _longest_form(data)


def _longest_form(utf8: bytes) -> int:
    """UTF-8 length of a text or of its NFD or NFKD form, whichever is longest: a
    normalizer that composes (NFC, NFKC) never lengthens what it decomposed."""
    text = utf8.decode("utf-8", "surrogatepass")
    longest = len(utf8)
    for form in ("NFD", "NFKD"):
        if not unicodedata.is_normalized(form, text):  # a quick check; most text is
            longest = max(longest, len(unicodedata.normalize(form, text).encode("utf-8", "surrogatepass")))
    return longest
