"""Read policy YAML into `Policy`, with every problem named by file, line and field.

YAML is composed once to learn where each key sits (and to reject duplicate keys,
which PyYAML would otherwise silently collapse), then loaded and validated. Cross
references (a model's upstream, a route's chain, a tenant's models) are checked after
the schema, with the same file:line:field messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.routing.policy import Policy
from gateway.yaml_lines import Loc, SafeLoader, dotted, read_text, walk

FRIENDLY = {
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
}


@dataclass(frozen=True)
class PolicyProblem:
    source: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class PolicyInvalid(Exception):
    def __init__(self, problems: list[PolicyProblem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


# A check the file alone cannot make, given by whoever knows more (every model priced:
# accounting/prices.py's `every_model_priced`). It gets the policy and the file's name,
# returns each problem as (where in the file, message), and raises PolicyInvalid for a
# problem that has no place in the file.
PolicyCheck = Callable[[Policy, str], Iterable[tuple[Loc, str]]]


def load_policy_file(path: str | Path, check: PolicyCheck | None = None) -> Policy:
    path = Path(path)
    try:
        text = read_text(path)
    except OSError as exc:
        raise PolicyInvalid([PolicyProblem(str(path), None, "", f"cannot read policy file: {exc.strerror}")]) from exc
    except ValueError as exc:
        raise PolicyInvalid([PolicyProblem(str(path), None, "", str(exc))]) from None
    return parse_policy(text, str(path), check)


def _parse_yaml(text: str, source: str) -> tuple[Any, dict[Loc, int]]:
    """The document, and the line of each key in it (once a duplicate key is ruled out)."""
    loader = SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise PolicyInvalid([PolicyProblem(source, 1, "", "the policy file is empty")])
        lines: dict[Loc, int] = {}
        problems = [PolicyProblem(source, line, dotted(loc), msg) for loc, line, msg in walk(root, (), lines)]
        if problems:
            raise PolicyInvalid(problems)
        return loader.construct_document(root), lines  # the nodes just walked: the text is parsed once
    except yaml.YAMLError as exc:  # a tag no safe loader builds (!!python/object) too
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise PolicyInvalid([PolicyProblem(source, line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from exc
    finally:
        loader.dispose()


def parse_policy(text: str, source: str = "<policy>", check: PolicyCheck | None = None) -> Policy:
    """With a `check`, what it finds are problems too."""
    data, lines = _parse_yaml(text, source)
    if not isinstance(data, dict):
        raise PolicyInvalid([PolicyProblem(source, 1, "", "the policy must be a mapping of sections")])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyInvalid([_problem(source, lines, tuple(e["loc"]), _message(e)) for e in exc.errors()]) from exc
    found = list(cross_reference_problems(policy))
    if check is not None:
        found += check(policy, source)
    problems = [_problem(source, lines, loc, msg) for loc, msg in found]
    if problems:
        raise PolicyInvalid(problems)
    return policy


def cross_reference_problems(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for name, model in policy.models.items():
        if model.upstream not in policy.upstreams:
            yield ("models", name, "upstream"), f"names upstream `{model.upstream}`, which is not defined under `upstreams`"
        for i, fallback in enumerate(model.fallbacks):
            if fallback not in policy.models or fallback == name:
                yield ("models", name, "fallbacks", i), f"names `{fallback}`, which is not another model under `models`"
    for name, route in policy.routes.items():
        if name in policy.models:
            yield ("routes", name), f"route `{name}` has the same name as a model; clients could not tell them apart"
        for i, step in enumerate(route.chain):
            if step not in policy.models:
                yield ("routes", name, "chain", i), f"names model `{step}`, which is not defined under `models`"
    for name, tenant in policy.tenants.items():
        for i, allowed in enumerate(tenant.models or ()):
            if allowed not in policy.models and allowed not in policy.routes:
                yield ("tenants", name, "models", i), f"names `{allowed}`, which is neither a model nor a route"
    seen: dict[str, str] = {}
    for name, tenant in policy.tenants.items():
        for i, digest in enumerate(tenant.api_keys):
            if digest in seen and seen[digest] != name:
                yield ("tenants", name, "api_keys", i), f"this key already belongs to tenant `{seen[digest]}`"
            seen.setdefault(digest, name)




def _message(error: Any) -> str:
    kind = error["type"]
    if kind in FRIENDLY:
        return FRIENDLY[kind]
    return str(error["msg"]).removeprefix("Value error, ")


def _problem(source: str, lines: dict[Loc, int], loc: Loc, message: str) -> PolicyProblem:
    loc = _strip_union_tags(loc)
    probe = loc
    while probe and probe not in lines:
        probe = probe[:-1]
    return PolicyProblem(source, lines.get(probe), dotted(loc), message)


def _strip_union_tags(loc: Loc) -> Loc:
    # pydantic adds the union member's type name (e.g. "function-after[...]", "int") to locs.
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and p not in {"str", "int", "list[str]"}))

