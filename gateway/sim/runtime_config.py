"""`POST /sim/config`: patch a simulator's config dataclass at runtime, type-checked.

Tests flip fault rates and latencies on a running server; a typo'd field or a wrong
type must fail loudly instead of silently doing nothing.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

from gateway.sim.generation import SimRequestError


def patch_config(config: Any, patch: Any) -> dict[str, Any]:
    """Apply `patch` to the dataclass `config`; returns the fields it changed."""
    if not isinstance(patch, Mapping):
        raise SimRequestError("Expected a JSON object of config fields.")
    hints = typing.get_type_hints(type(config))
    coerced: dict[str, Any] = {}
    for name, value in patch.items():
        if name not in hints:
            raise SimRequestError(f"Unknown config field {name!r}.", name)
        coerced[name] = _coerce(name, value, hints[name])
    for name, value in coerced.items():
        setattr(config, name, value)
    return coerced


def _coerce(name: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(name, value, inner)
    if origin is list and isinstance(value, list):
        return [_coerce(name, v, args[0]) for v in value]
    if origin is dict and isinstance(value, Mapping):
        return {str(k): _coerce(name, v, args[1]) for k, v in value.items()}
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is str and isinstance(value, str):
        return value
    if isinstance(tp, type) and issubclass(tp, tuple) and isinstance(value, list | Mapping):
        fields = getattr(tp, "_fields", ())
        items = [value.get(f) for f in fields] if isinstance(value, Mapping) else value
        if len(items) == len(fields):
            return tp(*(_coerce(name, v, float) for v in items))
    raise SimRequestError(f"Invalid value for config field {name!r}: {value!r}.", name)
