"""Process settings from the environment. Everything else lives in the policy file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Settings(BaseModel):
    """Each field not given to the constructor comes from the environment variable of
    its name (in any case: GATEWAY_POLICY, DATABASE_URL...), validated like the rest.
    Read here rather than with pydantic-settings, whose import is ~65 ms of start-up."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    gateway_policy: Path | None = Field(default=None, description="policy YAML path")
    database_url: str | None = Field(default=None, description="SQLite (default, under var_dir) or PostgreSQL URL")
    redis_url: str | None = Field(default=None, description="unset: in-process state")
    gateway_redis_prefix: str = Field(default="gw", description="key prefix, so several gateways can share one Redis")
    gateway_admin_key: str | None = None
    gateway_metrics_key: str | None = Field(default=None, description="bearer token for /metrics; unset: no tenant-labelled series")
    gateway_secret: str | None = Field(default=None, description="derives cache salts and cache-key hashes")
    gateway_var_dir: Path = Path("var")
    gateway_policy_poll_s: float = Field(default=1.0, gt=0)
    gateway_pricing_dir: Path = Field(default=Path(__file__).resolve().parent.parent / "pricing")
    gateway_sweep_interval_s: float = Field(default=5.0, gt=0)  # a dead replica's holds end seconds after their deadline

    @model_validator(mode="before")
    @classmethod
    def _from_environment(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        environment = {name.lower(): value for name, value in os.environ.items()}
        return {name: environment[name] for name in cls.model_fields if name in environment} | given

    @field_validator("gateway_metrics_key")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # `GATEWAY_METRICS_KEY: ${GATEWAY_METRICS_KEY:-}` in a compose file gives "": no key.
        return value or None

    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.gateway_var_dir / 'ledger.db'}"
