"""Where each key of a YAML document sits, for messages that name file, line and field;
and duplicate keys, which PyYAML would otherwise silently collapse to the last one.

Also the bounds on what such a file may be: its size, and the document its aliases make.
PyYAML composes an alias as the node it names, so nine lines of nine aliases each make a
document of 9**9 values from 378 bytes (an "alias bomb": `gateway policy check` ran two
minutes into 11 GB on one); an alias inside the node it names makes an endless one.

Shared by the policy loader and the pricing files. Imports nothing from the package."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

Loc = tuple[str | int, ...]
# libyaml's parser where PyYAML has it (its wheels do): the same nodes, marks and values
# as the pure-Python one, ~10x faster (a policy or pricing file: ~0.5 ms against ~5).
SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A policy or pricing file is a few KiB; these leave them room to grow a thousandfold.
MAX_FILE_BYTES = 4 * 1024 * 1024
# Values that aliases may add to a document beyond those written out in it (an alias
# for a price block, in each of a thousand models, adds a few thousand).
MAX_ALIASED_NODES = 100_000
# Levels of nesting (a policy has about six; PyYAML's own limit is a thousand, past
# Python's recursion limit for what reads the document next).
MAX_DEPTH = 64


def read_text(path: Path) -> str:
    """The file as text. Raises OSError when it cannot be read, and ValueError, with a
    message for its reader, when it is over MAX_FILE_BYTES (reading no further) or not
    UTF-8."""
    with path.open("rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"the file is over {MAX_FILE_BYTES // 2**20} MiB; a policy or pricing file is a few KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the file is not UTF-8 text (byte {exc.start} is not)") from None


def walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> Iterator[tuple[Loc, int, str]]:
    """Fill `lines` (location -> 1-based line) and yield (loc, line, message) per duplicate
    key; or, for a document its aliases make too large or endless, or that nests too deep,
    yield that one problem and fill nothing: the document is not to be read."""
    problem = shape_problem(node, loc)
    if problem is not None:
        yield problem
        return
    yield from _walk(node, loc, lines)


def _walk(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> Iterator[tuple[Loc, int, str]]:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        first_seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key in first_seen:
                yield (*loc, key), line, f"duplicate key `{key}` (first defined at line {first_seen[key]})"
                continue
            first_seen[key] = line
            yield from _walk(value_node, (*loc, key), lines)
            lines[(*loc, key)] = line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _walk(item, (*loc, i), lines)


def shape_problem(root: yaml.Node, loc: Loc = ()) -> tuple[Loc, int, str] | None:
    """What makes the document under `root` unfit to read, if anything: (loc, line,
    message) for an alias inside the node it names, aliases that add more than
    MAX_ALIASED_NODES values, or nesting deeper than MAX_DEPTH. Linear in the nodes
    as written: each is measured once, however many aliases name it."""
    sizes: dict[int, int] = {}  # node id -> values in it, aliases expanded
    heights: dict[int, int] = {}  # node id -> levels of nesting in it
    on_path: set[int] = set()  # the nodes being measured: a node's ancestors
    stack: list[tuple[yaml.Node, Loc, yaml.Node | None, bool]] = [(root, loc, None, False)]
    while stack:
        node, where, parent, measured = stack.pop()
        key = id(node)
        if key in sizes:
            continue  # measured already, through another alias
        children = _children(node)
        if measured:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for _, child in children)
            heights[key] = 1 + max((heights[id(child)] for _, child in children), default=0)
            continue
        if key in on_path:
            line = (parent or node).start_mark.line + 1
            return where, line, "this alias names a node that contains it: the document would never end"
        on_path.add(key)
        stack.append((node, where, parent, True))
        stack.extend((child, (*where, label), node, False) for label, child in reversed(children))
    if heights[id(root)] > MAX_DEPTH:
        where, node = _descend(root, loc, lambda child: heights[id(child)], MAX_DEPTH)  # the first level past it
        return where, node.start_mark.line + 1, f"nests more than {MAX_DEPTH} levels deep"
    written = len(sizes)
    if sizes[id(root)] > written + MAX_ALIASED_NODES:
        # Down to the smallest part that is too large: where the aliases multiply.
        where, node = _descend(root, loc, lambda child: sizes[id(child)], None, written + MAX_ALIASED_NODES)
        return where, node.start_mark.line + 1, (
            f"the aliases here make {sizes[id(node)]:,} values from {written:,} written out; at most "
            f"{MAX_ALIASED_NODES:,} may come from aliases (nested aliases multiply: write the values out)")
    return None


def _children(node: yaml.Node) -> list[tuple[str | int, yaml.Node]]:
    if isinstance(node, yaml.MappingNode):
        return [pair for key, value in node.value for pair in ((_label(key), key), (_label(key), value))]
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    return []


def _label(key: yaml.Node) -> str:
    return str(key.value) if isinstance(key, yaml.ScalarNode) else "?"


def _descend(node: yaml.Node, loc: Loc, measure: Callable[[yaml.Node], int], steps: int | None = None,
             above: int = 0) -> tuple[Loc, yaml.Node]:
    """From `node`, down through its largest child (by `measure`) `steps` times, or while
    that child measures more than `above`: the place to name in a message."""
    while steps is None or steps > 0:
        children = _children(node)
        if not children:
            break
        label, child = max(children, key=lambda pair: measure(pair[1]))
        if steps is None and measure(child) <= above:
            break
        node, loc = child, (*loc, label)
        steps = None if steps is None else steps - 1
    return loc, node


def dotted(loc: Loc) -> str:
    """`models.a.price[0]` style."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
