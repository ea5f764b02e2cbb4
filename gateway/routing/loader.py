"""Read policy YAML into `Policy`, with every problem named by file, line and field.

YAML is composed once to learn where each key sits (and to reject duplicate keys,
which PyYAML would otherwise silently collapse), then loaded and validated. Cross
references (a model's upstream, a route's chain, a tenant's models) are checked after
the schema, with the same file:line:field messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from gateway.routing.policy import Policy
from gateway.yaml_lines import Loc, SafeLoader, dotted, read_text, walk

if TYPE_CHECKING:
    from gateway.accounting.prices import PriceCatalog


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


def load_policy_file(path: str | Path, catalog: PriceCatalog | None = None) -> Policy:
    path = Path(path)
    try:
        text = read_text(path)
    except OSError as exc:
        raise PolicyInvalid([PolicyProblem(str(path), None, "", f"cannot read policy file: {exc.strerror}")]) from exc
    except ValueError as exc:
        raise PolicyInvalid([PolicyProblem(str(path), None, "", str(exc))]) from None
    return parse_policy(text, str(path), catalog)


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


def parse_policy(text: str, source: str = "<policy>", catalog: PriceCatalog | None = None) -> Policy:
    """With a price catalog, a model that has no price anywhere is a problem too."""
    data, lines = _parse_yaml(text, source)
    if not isinstance(data, dict):
        raise PolicyInvalid([PolicyProblem(source, 1, "", "the policy must be a mapping of sections")])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyInvalid([_problem(source, lines, tuple(e["loc"]), _message(e)) for e in exc.errors()]) from exc
    found = list(cross_reference_problems(policy))
    if catalog is not None:
        from gateway.accounting.prices import PricingInvalid, missing_prices  # prices reads policies too

        try:
            unpriced = missing_prices(policy, catalog, datetime.now(UTC))
        except PricingInvalid as exc:  # litellm's map, read now that a model needs it, is unreadable
            raise PolicyInvalid([PolicyProblem(source, None, "models", problem) for problem in exc.problems]) from exc
        found += [(("models", name), f"model `{name}` has no price: add `price:` here, or an entry in pricing/*.yaml "
                   "(litellm's price map does not know it either)") for name in unpriced]
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

