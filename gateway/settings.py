"""Process settings from the environment. Everything else lives in the policy file."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", frozen=True)

    gateway_policy: Path | None = Field(default=None, description="policy YAML path")
    database_url: str | None = Field(default=None, description="SQLite (default, under var_dir) or PostgreSQL URL")
    redis_url: str | None = Field(default=None, description="unset: in-process state")
    gateway_redis_prefix: str = Field(default="gw", description="key prefix, so several gateways can share one Redis")
    gateway_admin_key: str | None = None
    gateway_secret: str | None = Field(default=None, description="derives cache salts and cache-key hashes")
    gateway_var_dir: Path = Path("var")
    gateway_policy_poll_s: float = Field(default=1.0, gt=0)
    gateway_pricing_dir: Path = Field(default=Path(__file__).resolve().parent.parent / "pricing")
    gateway_sweep_interval_s: float = Field(default=30.0, gt=0)

    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.gateway_var_dir / 'ledger.db'}"
