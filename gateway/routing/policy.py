"""The policy file's schema: strict pydantic models (unknown keys are errors).

These models describe what users write. `gateway.routing.loader` reads YAML into them
with line numbers kept for messages; `gateway.routing.resolved` turns them into the
runtime objects the request path uses.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, FilePath, field_validator, model_validator

KEY_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"

Name = Annotated[str, Field(pattern=NAME, max_length=128)]
Tokenizer = Literal["o200k_base", "cl100k_base", "o200k_harmony", "p50k_base", "r50k_base"]
Usd = Annotated[Decimal, Field(ge=0, max_digits=18, decimal_places=9)]
PositiveSeconds = Annotated[float, Field(gt=0, le=86_400)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


def _http_url(value: str) -> str:
    """Checked here rather than with pydantic's HttpUrl, whose module (and the package
    metadata it reads) is ~40 ms of every start-up."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
    _ = parts.port  # raises for a port that is not a number from 0 to 65535
    return value


HttpUrl = Annotated[str, Field(min_length=1, max_length=2083, json_schema_extra={"format": "uri"}), AfterValidator(_http_url)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Price(Strict):
    """USD per 1M tokens."""

    input: Usd
    output: Usd
    cached_input: Usd | None = None
    cache_write: Usd | None = None
    cache_write_1h: Usd | None = Field(default=None, description="Anthropic's 1-hour cache writes; none: litellm's rate, else cache_write")


class RateLimits(Strict):
    rpm: Annotated[int, Field(ge=1)] | None = Field(default=None, description="requests per minute")
    tpm: Annotated[int, Field(ge=1)] | None = Field(default=None, description="tokens per minute (prompt estimate + output bound)")


class TenantLimits(RateLimits):
    max_queue: Annotated[int, Field(ge=0, le=100_000)] = Field(default=64, description="requests that may wait for capacity")
    max_wait_s: Annotated[float, Field(ge=0, le=600)] = Field(default=5.0, description="longest a request waits for capacity")


class PoolSettings(Strict):
    """kind vllm: how requests are placed on the pool's replicas (routing/replica_choice.py)."""

    block_size: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        default=None, description="tokens per KV block; default: the replicas' vllm:cache_config_info, else 16")
    kv_blocks: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="KV blocks per replica, the size of the router's prefix index; default: vllm:cache_config_info num_gpu_blocks")
    max_num_seqs: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="requests a replica runs at once (its --max-num-seqs); default: learned from its metrics once it queues")
    load_factor: Annotated[float, Field(ge=1, le=10)] = Field(
        default=1.5, description="a replica takes at most this times the pool's average load while others have room")
    home_share_factor: Annotated[float, Field(ge=1, le=10)] = Field(
        default=1.3, description="prefixes get home replicas so that none has more than this times the average recent traffic")
    max_kv_usage: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.95, description="a replica using more of its KV cache than this takes new requests only when all do")
    max_queue_wait_s: Annotated[float, Field(gt=0, le=3600)] | None = Field(
        default=None, description="spill to the model's fallbacks when the predicted queue wait is longer; default: only past the deadline")
    scrape_interval_s: Annotated[float, Field(ge=0.05, le=60)] = Field(
        default=1.0, description="how often each replica's /health and /metrics are read")
    eject_after_errors: Annotated[int, Field(ge=1, le=100)] = Field(
        default=3, description="consecutive 5xx answers that take a replica out until /health says it is back")


class Upstream(Strict):
    kind: Literal["openai", "vllm", "anthropic"] = Field(description="anthropic: base_url as in the anthropic SDK, without /v1")
    base_url: HttpUrl | None = None
    replicas: list[HttpUrl] | None = Field(default=None, min_length=1)
    api_key_env: EnvName | None = None
    admin_key_env: EnvName | None = Field(default=None, description=(
        "the variable holding the provider's admin key, for its usage and cost reports (reconciliation): OpenAI's "
        "organization usage/costs APIs, Anthropic's Admin API (sk-ant-admin...); kind openai falls back to api_key_env"))
    timeout_s: PositiveSeconds = 600.0
    connect_timeout_s: PositiveSeconds = 5.0
    max_connections: Annotated[int, Field(ge=1, le=10_000)] = 512
    # Below common server keep-alive timeouts (uvicorn 5 s), so an idle pooled
    # connection is dropped by us before the server closes it under a new request.
    keepalive_s: Annotated[float, Field(gt=0, le=3600)] = 4.0
    provider_key_id: str | None = Field(default=None, description="the id the provider's usage reports give the key this upstream uses")
    limits: RateLimits | None = Field(default=None, description="the provider's limits for our key, so we slow down before it says 429")
    prompt_cache_key: bool = Field(default=True, description="kind openai: send a tenant-scoped prompt_cache_key (turn off for servers that reject it)")
    ca_bundle: FilePath | None = Field(default=None, description="PEM file of the CAs to trust for this upstream instead of the system's")
    client_cert: FilePath | None = Field(default=None, description="PEM client certificate (mutual TLS); its key too unless client_key is given")
    client_key: FilePath | None = Field(default=None, description="PEM private key of client_cert")
    max_response_bytes: Annotated[int, Field(ge=1024)] = Field(
        default=32 * 1024 * 1024, description="a non-streamed answer larger than this is refused (502), never asked for again")
    max_event_bytes: Annotated[int, Field(ge=1024)] = Field(
        default=1024 * 1024, description="one streamed event larger than this ends the stream (502 before it starts)")
    pool: PoolSettings | None = Field(default=None, description="kind vllm: replica choice, health and spill-over")

    @model_validator(mode="after")
    def _one_address(self) -> Upstream:
        if (self.base_url is None) == (self.replicas is None):
            raise ValueError("give exactly one of `base_url` or `replicas`")
        if self.replicas is not None and self.kind != "vllm":
            raise ValueError("`replicas` is only for `kind: vllm`")
        if self.pool is not None and self.kind != "vllm":
            raise ValueError("`pool` is only for `kind: vllm`")
        if self.client_key is not None and self.client_cert is None:
            raise ValueError("`client_key` needs `client_cert`")
        return self

    def pool_settings(self) -> PoolSettings:
        return self.pool if self.pool is not None else PoolSettings()

    def urls(self) -> list[str]:
        urls = self.replicas if self.replicas is not None else [self.base_url]
        return [str(u).rstrip("/") for u in urls if u is not None]


class Model(Strict):
    upstream: Name
    upstream_model: str | None = Field(default=None, description="name sent upstream; defaults to the key")
    price: Price | None = None
    tokenizer: Tokenizer | None = Field(default=None, description="tiktoken encoding for estimates")
    provider_tokenizer: Literal["tiktoken", "unknown"] = Field(default="unknown", description=(
        "tiktoken: the provider counts prompts with this model's `tokenizer` (OpenAI's models on OpenAI's API), so budget "
        "holds may use that count; unknown: holds cover what any byte-level tokenizer could count (README: Money)"))
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    limits: RateLimits | None = None
    fallbacks: list[Name] = Field(default_factory=list, description="models to fail over to when this one's upstream keeps failing")
    cache: bool | None = Field(default=None, description="opt this model's answers in (true) or out (false) of the response cache")
    auto_cache_control: bool = Field(default=False, description=(
        "kind anthropic: when a request marks no cache_control, mark its system prompt (else its tools) so Anthropic "
        "caches that prefix and later calls read it at the cached rate"))

    @model_validator(mode="after")
    def _names_the_providers_encoding(self) -> Model:
        # The default encoding is a guess for estimates; a count that holds money must be in the provider's own.
        if self.provider_tokenizer == "tiktoken" and self.tokenizer is None:
            raise ValueError("`provider_tokenizer: tiktoken` needs `tokenizer`: the encoding the provider counts with")
        return self


class Budget(Strict):
    usd: Usd
    period: Literal["month", "day", "total"] = "month"


class TaskLimits(Strict):
    """Limits a task gets when POST /v1/tasks does not set them."""

    # The upper bounds keep a task's budget row within the ledger's columns: pico-USD and
    # tokens in 64-bit integers, calls in 32-bit ones.
    budget_usd: Annotated[Usd, Field(le=1_000_000)] | None = None
    max_calls: Annotated[int, Field(ge=1, le=1_000_000_000)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=10**15)] | None = None
    deadline_s: PositiveSeconds | None = None


class TenantCache(Strict):
    enabled: bool | None = Field(default=None, description="opt this tenant in or out of the response cache")
    response_ttl_s: Annotated[float, Field(ge=0, le=30 * 86_400)] | None = None
    group: Name | None = Field(default=None, description="tenants naming the same group share cached answers; default private")


class Tenant(Strict):
    api_keys: list[str] = Field(default_factory=list)
    models: list[Name] | None = Field(default=None, description="models and routes this tenant may use; default all")
    budget: Budget | None = None
    task_limits: TaskLimits | None = None
    limits: TenantLimits | None = None
    priority: Literal["interactive", "batch"] = Field(default="interactive", description="batch waits behind interactive traffic")
    cache: TenantCache | None = None

    @field_validator("api_keys")
    @classmethod
    def _digests_only(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not KEY_DIGEST.match(key):
                raise ValueError(
                    "api_keys holds `sha256:<64 hex>` digests only, never raw keys "
                    "(`gateway keys new --tenant NAME` prints one)"
                )
        return keys


class RouteMatch(Strict):
    task_class: str | list[str] | None = None
    tenant: Name | list[Name] | None = None
    has_tools: bool | None = None
    response_format: Literal["text", "json_object", "json_schema"] | None = None
    min_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    max_prompt_tokens: Annotated[int, Field(ge=0)] | None = None


SimpleSignal = Literal["invalid_json", "schema_mismatch", "truncated", "invalid_tool_call", "empty"]


class ClientSignal(Strict):
    header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]+$")]
    below: float | None = Field(default=None, description="escalate when the header's number is below this")
    equals: str | None = Field(default=None, description="escalate when the header has this value")

    @model_validator(mode="after")
    def _one_test(self) -> ClientSignal:
        if (self.below is None) == (self.equals is None):
            raise ValueError("give exactly one of `below` or `equals`")
        return self


class MissingFields(Strict):
    missing_fields: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)


class ClientSignalRule(Strict):
    client_signal: ClientSignal


EscalationSignal = SimpleSignal | MissingFields | ClientSignalRule


class Route(Strict):
    match: RouteMatch | None = None
    chain: list[Name] = Field(min_length=1, description="models, cheapest first")
    escalate_when: list[EscalationSignal] = Field(default_factory=list, description="verifiable signals that move to the next model")
    streaming: Literal["buffer", "no_escalation"] = Field(
        default="buffer", description="with checks: buffer a streamed answer until it passes, or stream the first model's answer unchecked")


class Retry(Strict):
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    budget_ratio: Annotated[float, Field(ge=0, le=10)] = Field(default=0.2, description="retries allowed per first attempt, over a window")
    base_s: Annotated[float, Field(gt=0, le=60)] = 0.5
    cap_s: Annotated[float, Field(gt=0, le=600)] = 8.0
    cooldown_after: Annotated[int, Field(ge=1, le=1000)] = Field(default=5, description="consecutive failures that cool an upstream down")
    cooldown_s: Annotated[float, Field(ge=0, le=3600)] = 10.0


class Tool(Strict):
    url: HttpUrl
    method: Literal["GET", "POST"] = "POST"
    version: Annotated[str, Field(min_length=1, max_length=64)] = "1"
    ttl_s: Annotated[float, Field(ge=0, le=30 * 86_400)] = 300.0
    cacheable: bool = True
    scope: Literal["tenant", "shared"] = Field(default="tenant", description="shared: one cache for every tenant (public data only)")
    price_usd: Usd | None = Field(default=None, description="cost booked per call that reaches the tool")
    timeout_s: PositiveSeconds = 30.0


class Defaults(Strict):
    max_output_tokens: Annotated[int, Field(ge=1)] = 4096
    request_timeout_s: PositiveSeconds = 600.0
    max_body_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    tokenizer: Tokenizer = "o200k_base"
    task_limits: TaskLimits = Field(default_factory=TaskLimits)
    # Holds sized from a count (models with `provider_tokenizer: tiktoken`) add this much:
    # the count estimates chat framing and tool definitions, which the provider counts its way.
    prompt_margin_ratio: Annotated[Decimal, Field(ge=0, le=1)] = Decimal("0.02")
    prompt_margin_tokens: Annotated[int, Field(ge=0, le=10_000)] = 8
    retry: Retry = Field(default_factory=Retry)
    response_cache_ttl_s: Annotated[float, Field(ge=0, le=30 * 86_400)] = 300.0
    response_cache_max_bytes: Annotated[int, Field(ge=0)] = 64 * 1024 * 1024
    cache_nondeterministic: bool = Field(default=False, description="also cache requests with temperature > 0 and no seed")
    stored_responses_ttl_s: Annotated[float, Field(gt=0, le=366 * 86_400)] = Field(
        default=30 * 86_400.0, description="how long a stored Responses-API response (and the conversation it ends) is kept")
    stored_response_max_bytes: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = Field(
        default=4 * 1024 * 1024, description="the largest stored response, its whole conversation included; a turn that"
                                             " would store more is refused with a 400 before any upstream call")
    reservation_grace_s: Annotated[float, Field(ge=0, le=86_400)] = Field(
        default=30.0, description="how long past its request's deadline an unsettled hold waits before any replica's sweeper"
                                  " expires it at an estimate (a replica that died mid-call never settles its holds)")


class Policy(Strict):
    version: Literal[1]
    defaults: Defaults = Field(default_factory=Defaults)
    upstreams: dict[Name, Upstream]
    models: dict[Name, Model]
    tenants: dict[Name, Tenant] = Field(default_factory=dict)
    routes: dict[Name, Route] = Field(default_factory=dict)
    tools: dict[Name, Tool] = Field(default_factory=dict)
