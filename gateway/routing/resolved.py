"""The policy resolved into what the request path needs: key lookup, per-tenant model
access, and for each requested name the ordered list of concrete targets."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth.keys import KeyIndex
from gateway.errors import ModelNotFound
from gateway.routing.policy import Policy, Price, RouteMatch


@dataclass(frozen=True, slots=True)
class ModelTarget:
    name: str
    upstream: str
    upstream_kind: str
    upstream_model: str
    price: Price | None
    tokenizer: str
    max_output_tokens: int


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing may look at: request signals, never the content."""

    tenant: str
    task_class: str | None
    has_tools: bool
    response_format: str
    prompt_tokens: int


class RuntimePolicy:
    def __init__(self, policy: Policy, source: str = "<policy>") -> None:
        self.policy = policy
        self.source = source
        self.keys = KeyIndex({name: list(t.api_keys) for name, t in policy.tenants.items()})
        d = policy.defaults
        self.targets = {
            name: ModelTarget(
                name=name,
                upstream=m.upstream,
                upstream_kind=policy.upstreams[m.upstream].kind,
                upstream_model=m.upstream_model or name,
                price=m.price,
                tokenizer=m.tokenizer or d.tokenizer,
                max_output_tokens=m.max_output_tokens or d.max_output_tokens,
            )
            for name, m in policy.models.items()
        }

    def visible_models(self, tenant: str) -> list[str]:
        allowed = self.policy.tenants[tenant].models
        names = [*self.policy.models, *self.policy.routes]
        return names if allowed is None else [n for n in names if n in allowed]

    def tenant_may_use(self, tenant: str, name: str) -> bool:
        allowed = self.policy.tenants[tenant].models
        return allowed is None or name in allowed

    def routes_on_prompt_size(self, name: str) -> bool:
        """Whether choosing among `name`'s targets needs the prompt's token count."""
        route = self.policy.routes.get(name)
        match = route.match if route is not None else None
        return match is not None and (match.min_prompt_tokens is not None or match.max_prompt_tokens is not None)

    def needs_token_counts(self) -> bool:
        """Whether requests here routinely need counted prompts (token-per-minute
        limits, prompt-length routes), so the tokenizers are worth loading up front."""
        p = self.policy
        limits = [t.limits for t in p.tenants.values()] + [m.limits for m in p.models.values()] + [u.limits for u in p.upstreams.values()]
        return any(lim is not None and lim.tpm is not None for lim in limits) or any(self.routes_on_prompt_size(r) for r in p.routes)

    def candidates(self, name: str, request: RouteRequest) -> tuple[str | None, list[ModelTarget]]:
        """(route name or None, ordered targets) for a requested model name."""
        if not self.tenant_may_use(request.tenant, name):
            raise _unknown(name)
        if name in self.targets:
            return None, [self.targets[name]]
        route = self.policy.routes.get(name)
        if route is None:
            raise _unknown(name)
        if route.match is not None and not route_matches(route.match, request):
            raise ModelNotFound(f"route `{name}` does not apply to this request (its match conditions are not met)", param="model")
        return name, [self.targets[m] for m in route.chain]


def route_matches(match: RouteMatch, request: RouteRequest) -> bool:
    def one_of(value: str | None, wanted: str | list[str] | None) -> bool:
        return wanted is None or value == wanted or (isinstance(wanted, list) and value in wanted)

    return (
        one_of(request.task_class, match.task_class)
        and one_of(request.tenant, match.tenant)
        and (match.has_tools is None or match.has_tools == request.has_tools)
        and (match.response_format is None or match.response_format == request.response_format)
        and (match.min_prompt_tokens is None or request.prompt_tokens >= match.min_prompt_tokens)
        and (match.max_prompt_tokens is None or request.prompt_tokens <= match.max_prompt_tokens)
    )


def _unknown(name: str) -> ModelNotFound:
    return ModelNotFound(f"The model `{name}` does not exist or you do not have access to it.", param="model")
