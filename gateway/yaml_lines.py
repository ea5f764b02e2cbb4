"""Where each key of a YAML document sits, for messages that name file, line and field;
and duplicate keys, which PyYAML would otherwise silently collapse to the last one.

Shared by the policy loader and the pricing files. Imports nothing from the package."""

from __future__ import annotations

from collections.abc import Iterator

import yaml

Loc = tuple[str | int, ...]
# libyaml's parser where PyYAML has it (its wheels do): the same nodes, marks and values
# as the pure-Python one, ~10x faster (a policy or pricing file: ~0.5 ms against ~5).
SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> Iterator[tuple[Loc, int, str]]:
    """Fill `lines` (location -> 1-based line) and yield (loc, line, message) per duplicate key."""
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        first_seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key in first_seen:
                yield (*loc, key), line, f"duplicate key `{key}` (first defined at line {first_seen[key]})"
                continue
            first_seen[key] = line
            yield from walk(value_node, (*loc, key), lines)
            lines[(*loc, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from walk(item, (*loc, i), lines)


def dotted(loc: Loc) -> str:
    """`models.a.price[0]` style."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
