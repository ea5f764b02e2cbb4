"""The prompt's bound is never below what a byte-level tokenizer counts for the prompt a
chat template renders: the worst one (one token per byte, after whichever Unicode
normalization lengthens the text most), a real non-tiktoken BPE (the Claude tokenizer
the litellm wheel ships, which normalizes NFKC) and tiktoken's - for ASCII, CJK, emoji,
compatibility characters, tools and many short messages, under templates modelled on
ChatML with Hermes tools (Qwen 2.5) and on Llama 3.1 (tools as 4-space-indented JSON)."""

from __future__ import annotations

import importlib.util
import json
import re
import unicodedata
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.tokens.counting import count_chat_tokens, get_encoding
from gateway.tokens.prompt_bound import prompt_tokens_bound

SPECIAL = re.compile(r"(<\|[a-z_]+\|>)")  # a special token: one token, whatever its spelling

PROSE = ("The quarterly report shows revenue up 12% year over year, driven by the new subscription tier; "
         "costs rose 4%, mostly cloud spend. Summarize it for the board in three bullet points.")
CJK = "東京は日本の首都です。人口は約1400万人で、世界有数の大都市圏を形成している。请用中文总结这段话。"
EMOJI = "Family 👩‍👩‍👧‍👦, flags 🇯🇵🇧🇷🇺🇦, skin tones 👍🏽👋🏿, and a robot 🤖 launching 🚀."
# Each of these grows under some normalizer: U+FDFA is 18 letters in NFKC, Hangul doubles in NFD.
COMPAT = "\ufdfa" * 40 + " ＦＵＬＬＷＩＤＴＨ ﬁﬂ ㎒ ½ " + "한국어 문장입니다 " * 10
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city. 都市の天気。",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "when": {"type": "object", "properties": {"day": {"type": "string", "enum": ["today", "tomorrow"]},
                                                   "hours": {"type": "array", "items": {"type": "integer"}}}}}}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
ARGS = json.dumps({"city": "Zürich", "when": {"day": "today", "hours": [9, 12, 18]}}, ensure_ascii=False)

BODIES: dict[str, dict[str, Any]] = {
    "ascii": {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROSE}]},
    "cjk": {"messages": [{"role": "user", "content": CJK * 3}]},
    "emoji": {"messages": [{"role": "user", "content": EMOJI * 3, "name": "émile"}]},
    "compatibility": {"messages": [{"role": "user", "content": COMPAT}]},
    "parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": PROSE}, {"type": "text", "text": CJK}]}]},
    "empty": {"messages": [{"role": "user", "content": ""}]},
    "tools": {"tools": [WEATHER, SEARCH], "messages": [
        {"role": "user", "content": "Weather in Zürich today?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21, "sky": "clear ☀️"}'},
        {"role": "user", "content": "And tomorrow?"}]},
    "many short messages": {"messages": [{"role": ("user", "assistant")[i % 2], "content": ("ok", "y")[i % 2]}
                                         for i in range(300)]},
}


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return content or ""


def chatml(body: dict[str, Any]) -> str:
    messages, tools = body["messages"], body.get("tools")
    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    if messages[0]["role"] == "system":
        system, messages = _text(messages[0]), messages[1:]
    if tools:
        system += ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                   "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
        system += "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        system += ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                   'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
                   '"arguments": <args-json-object>}\n</tool_call>')
    out = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    for m in messages:
        if m["role"] == "tool":
            out.append(f"<|im_start|>user\n<tool_response>\n{_text(m)}\n</tool_response><|im_end|>\n")
            continue
        text = (m["name"] + ": " if m.get("name") else "") + _text(m)
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            args = json.dumps(json.loads(fn["arguments"]), ensure_ascii=False)
            text += f'\n<tool_call>\n{{"name": "{fn["name"]}", "arguments": {args}}}\n</tool_call>'
        out.append(f"<|im_start|>{m['role']}\n{text}<|im_end|>\n")
    return "".join(out) + "<|im_start|>assistant\n"


def llama31(body: dict[str, Any]) -> str:
    messages, tools = body["messages"], body.get("tools")
    system = ""
    if messages[0]["role"] == "system":
        system, messages = _text(messages[0]), messages[1:]
    out = ["<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n",
           "Environment: ipython\n" if tools else "",
           f"Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n{system}<|eot_id|>"]
    for i, m in enumerate(messages):
        role = "ipython" if m["role"] == "tool" else m["role"]
        text = _text(m)
        if tools and i == 0:
            text = ("Given the following functions, please respond with a JSON for a function call with its proper "
                    "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                    "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
                    + "".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in tools) + text)
        for call in m.get("tool_calls") or ():
            fn = call["function"]
            text += f'{{"name": "{fn["name"]}", "parameters": {json.dumps(fn["arguments"], ensure_ascii=False)}}}'
        out.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>")
    return "".join(out) + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def one_token_per_byte(text: str) -> int:
    """The most any byte-level BPE can count: every byte a token, after the normalizer
    (if any) that makes the text longest."""
    forms = [text, *(unicodedata.normalize(f, text) for f in ("NFC", "NFD", "NFKC", "NFKD"))]
    return max(len(t.encode()) for t in forms)


@cache
def claude_tokenizer() -> Callable[[str], int]:
    tokenizers = pytest.importorskip("tokenizers")
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers" / "anthropic_tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} is not in this litellm wheel")
    tok = tokenizers.Tokenizer.from_file(str(path))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def tiktoken_counter(name: str) -> Callable[[str], int]:
    encoding = get_encoding(name)
    return lambda text: len(encoding.encode_ordinary(text))


COUNTERS: dict[str, Callable[[], Callable[[str], int]]] = {
    "one token per byte": lambda: one_token_per_byte,
    "claude (NFKC)": claude_tokenizer,
    "o200k_base": lambda: tiktoken_counter("o200k_base"),
    "cl100k_base": lambda: tiktoken_counter("cl100k_base"),
}


def tokens(rendered: str, count: Callable[[str], int]) -> int:
    """Special tokens count one each; the text between them is tokenized piece by piece."""
    pieces = SPECIAL.split(rendered)
    return sum(1 if SPECIAL.fullmatch(piece) else count(piece) for piece in pieces if piece)


@pytest.mark.parametrize("counter", COUNTERS)
@pytest.mark.parametrize("template", [chatml, llama31], ids=["chatml", "llama3.1"])
@pytest.mark.parametrize("case", BODIES)
def test_the_bound_is_never_below_a_byte_level_count(case: str, template: Callable[[dict[str, Any]], str], counter: str) -> None:
    body = {"model": "m", **BODIES[case]}
    counted = tokens(template(body), COUNTERS[counter]())
    bound = prompt_tokens_bound("chat.completions", body)
    assert bound >= counted, f"{case}: bound {bound} < {counted} tokens"


def test_the_bound_is_above_the_gateway_tiktoken_estimate_too() -> None:
    for body in BODIES.values():
        assert prompt_tokens_bound("chat.completions", body) >= count_chat_tokens(body["messages"])


def test_tool_definitions_count_their_indented_rendering() -> None:
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    with_tools = {**plain, "tools": [WEATHER]}
    indented = len(json.dumps([WEATHER], indent=4, ensure_ascii=False).encode())
    assert prompt_tokens_bound("chat.completions", with_tools) - prompt_tokens_bound("chat.completions", plain) > indented


@pytest.mark.parametrize("text", [PROSE, CJK, EMOJI, COMPAT])
@pytest.mark.parametrize("endpoint,field", [("completions", "prompt"), ("embeddings", "input")])
def test_text_prompts_and_inputs_cover_every_byte_plus_begin_and_end_tokens(endpoint: str, field: str, text: str) -> None:
    assert prompt_tokens_bound(endpoint, {field: text}) >= one_token_per_byte(text) + 2
    assert prompt_tokens_bound(endpoint, {field: [text, text]}) >= 2 * (one_token_per_byte(text) + 2)


def test_token_ids_are_the_providers_own_tokens() -> None:
    assert prompt_tokens_bound("completions", {"prompt": [101, 2023, 2003, 1037]}) == 4
    assert prompt_tokens_bound("embeddings", {"input": [[1, 2, 3], [4, 5]]}) == 5


def test_a_completion_suffix_is_part_of_the_prompt() -> None:
    assert prompt_tokens_bound("completions", {"prompt": "def f(", "suffix": PROSE}) > len(PROSE)


def test_a_body_too_deep_to_send_on_is_a_client_error() -> None:
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    with pytest.raises(InvalidRequest) as raised:
        prompt_tokens_bound("chat.completions", {"messages": [{"role": "user", "content": "hi", "extra": deep}]})
    assert raised.value.http_status == 400
