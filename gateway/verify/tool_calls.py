"""Tool-call checks: each call names a declared tool and passes its `parameters` schema.

A model that invents a tool, emits arguments that are not JSON, or leaves out a
required parameter has given an answer the client cannot execute; those are facts we
can check, so a route may escalate on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

# (schema, instance) -> a short problem, or None when the instance conforms.
Validate = Callable[[Any, Any], str | None]

NO_SCHEMA: object = object()  # a declared tool without `parameters`: any JSON object will do


def has_tool_calls(message: Mapping[str, Any]) -> bool:
    return bool(message.get("tool_calls")) or bool(message.get("function_call"))


def declared_tools(request: Mapping[str, Any]) -> dict[str, Any]:
    """Tool name -> its parameters schema (or NO_SCHEMA), from `tools` and legacy `functions`."""
    declared: dict[str, Any] = {}
    for tool in _list(request.get("tools")):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            declared[fn["name"]] = fn.get("parameters", NO_SCHEMA)
    for fn in _list(request.get("functions")):
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            declared[fn["name"]] = fn.get("parameters", NO_SCHEMA)
    return declared


def tool_call_problems(request: Mapping[str, Any], message: Mapping[str, Any], validate: Validate) -> list[str]:
    """One short problem per bad call in `message` (empty when every call is usable)."""
    calls = list(_function_calls(message))
    if not calls:
        return []
    declared = declared_tools(request)
    problems: list[str] = []
    for call in calls:
        problem = _call_problem(call, declared, validate)
        if problem is not None:
            problems.append(problem)
    return problems


def _function_calls(message: Mapping[str, Any]) -> Iterator[Any]:
    """The `function` objects of the message's calls; a malformed call yields itself."""
    for call in _list(message.get("tool_calls")):
        if not isinstance(call, Mapping):
            yield call
        elif call.get("type", "function") == "function":  # custom tools carry free text, nothing to check
            yield call.get("function")
    legacy = message.get("function_call")
    if legacy is not None:
        yield legacy


def _call_problem(fn: Any, declared: Mapping[str, Any], validate: Validate) -> str | None:
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        return "a tool call without a function name"
    name = fn["name"]
    if name not in declared:
        return f"unknown tool {_short_name(name)!r}"
    raw = fn.get("arguments")
    if isinstance(raw, Mapping):  # some OpenAI-compatible servers send the object itself
        arguments: Any = raw
    else:
        try:
            arguments = orjson.loads(raw) if isinstance(raw, str | bytes) else None
        except orjson.JSONDecodeError:
            return f"{_short_name(name)}: arguments are not valid JSON"
    if not isinstance(arguments, Mapping):
        return f"{_short_name(name)}: arguments are not a JSON object"
    schema = declared[name]
    if schema is NO_SCHEMA:
        return None
    problem = validate(schema, arguments)
    return None if problem is None else f"{_short_name(name)}: {problem}"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _short_name(name: str) -> str:
    return name if len(name) <= 40 else name[:37] + "..."
