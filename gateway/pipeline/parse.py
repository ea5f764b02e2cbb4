"""Parse and check a client body, and bound its output (tokens/prompt_size.py counts its prompt).

Checks only what the gateway itself relies on (model, messages/input/prompt, stream,
bounds); everything else - including fields we do not know - passes through untouched.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import InvalidRequest, MalformedJSON

MAX_N = 128
# Far past any model's output limit; what a request may ask for is held against budgets
# (times `n`, times the price), and this keeps that hold within the ledger's 64 bits.
MAX_OUTPUT_TOKENS = 10_000_000
# How deep lists and objects may nest in a client's JSON. orjson reads 1,024 levels but
# writes at most 254, and the gateway writes what it reads again (upstream, cache keys,
# tool calls), at times inside an envelope of its own: this leaves room for those.
MAX_JSON_DEPTH = 240
ORJSON_WRITE_DEPTH = 254


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise MalformedJSON("the request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedJSON(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    # Nesting past the limit takes twice as many brackets: a shorter body needs no look.
    if len(raw) > 2 * MAX_JSON_DEPTH and nests_deeper(body, MAX_JSON_DEPTH):
        field = next((name for name, value in body.items() if nests_deeper(value, MAX_JSON_DEPTH - 1)), None)
        raise InvalidRequest(f"the request body nests lists and objects more than {MAX_JSON_DEPTH} levels deep"
                             + (f" (in `{field}`)" if field else ""), param=field)
    return body


def nests_deeper(value: Any, levels: int) -> bool:
    """Whether lists and objects in `value` nest more than `levels` deep (`[1]` is one).

    orjson is asked to write it inside enough lists that it refuses exactly then: one C
    call, about a quarter of the parse for a request with twenty tools and a tenth for a
    100 KB prompt, where a walk in Python takes three times the parse (and counting the
    brackets, for the long prompt, about twice)."""
    for _ in range(ORJSON_WRITE_DEPTH - levels):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return True
    return False


def check_body(endpoint: str, body: dict[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("`model` is required and must be a non-empty string", param="model")
    if endpoint == "chat.completions":
        _check_messages(body.get("messages"))
    elif endpoint in ("messages", "messages.count_tokens"):
        _check_anthropic_messages(endpoint, body)
    elif endpoint == "completions":
        if not isinstance(body.get("prompt"), (str, list)):
            raise InvalidRequest("`prompt` is required: a string or a list", param="prompt")
    elif endpoint == "embeddings" and (not isinstance(body.get("input"), (str, list)) or body.get("input") in ("", [])):
        raise InvalidRequest("`input` is required: a non-empty string or list", param="input")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be true or false", param="stream")
    n = body.get("n", 1)
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N):
        raise InvalidRequest(f"`n` must be an integer from 1 to {MAX_N}", param="n")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_OUTPUT_TOKENS):
            raise InvalidRequest(f"`{name}` must be an integer from 1 to {MAX_OUTPUT_TOKENS}", param=name)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` is required and must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"`messages[{i}]` must be an object with a string `role`", param=f"messages[{i}]")
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(_is_tool_call(call) for call in calls)):
            raise InvalidRequest(f"`messages[{i}].tool_calls` must be a list of objects, each with a `function` object",
                                 param=f"messages[{i}].tool_calls")


def _check_anthropic_messages(endpoint: str, body: dict[str, Any]) -> None:
    """What the gateway reads of a Messages request (Anthropic's field names in the
    messages, so a client sees the error it would get from the API itself)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: a non-empty list is required", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages.{i}: an object with a string `role` is required", param=f"messages.{i}")
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise InvalidRequest("system: a string or a list of content blocks is required", param="system")
    max_tokens = body.get("max_tokens")
    if endpoint == "messages" and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        # Anthropic requires it, and it is the output bound the budget hold is for.
        raise InvalidRequest("max_tokens: Field required (an integer)", param="max_tokens")


def _is_tool_call(call: Any) -> bool:
    # The token count reads each call's function name and arguments.
    return isinstance(call, dict) and isinstance(call.get("function"), dict | None)


def output_bound(endpoint: str, body: dict[str, Any], model_max: int) -> int:
    """Worst-case output tokens: the client's bound, else the model's, times n.

    When the client gives no bound the pipeline sends the model's, so this stays a
    true worst case for budget reservations."""
    if endpoint == "embeddings":
        return 0
    asked = body.get("max_completion_tokens") or body.get("max_tokens") or model_max
    return int(asked) * int(body.get("n") or 1)


def response_format_kind(body: dict[str, Any]) -> str:
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    return kind if kind in ("json_object", "json_schema") else "text"
