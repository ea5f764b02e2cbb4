"""What `gateway demo` keeps under the var folder (`var/demo/`): its policy (the user's
copy to edit), the tenant's API key, the admin key, the simulators' provider keys, their
usage reports and the ports they last ran on.

Read by the demo, and by the report commands a user runs next to it (`gateway
reconcile`, `gateway routes report`): with no policy named, they use the demo's, and
the simulator key it names, so they work against a running demo with no flags.
Standard library only: the CLI imports this before anything heavy."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DemoFiles:
    folder: Path

    @classmethod
    def under(cls, var_dir: Path) -> DemoFiles:
        return cls(var_dir / "demo")

    @classmethod
    def of_this_process(cls) -> DemoFiles:
        """Under GATEWAY_VAR_DIR (default `var`), as the demo and Settings read it."""
        return cls.under(Path(os.environ.get("GATEWAY_VAR_DIR", "var")))

    @property
    def policy(self) -> Path:
        return self.folder / "policy.yaml"

    @property
    def api_key(self) -> Path:
        return self.folder / "api-key"

    @property
    def admin_key(self) -> Path:
        return self.folder / "admin-key"

    @property
    def provider_keys(self) -> Path:
        """`NAME=value` lines: the provider keys the demo policy's `api_key_env` names."""
        return self.folder / "provider-keys.env"

    @property
    def hosted_usage(self) -> Path:
        return self.folder / "hosted-usage.jsonl"

    @property
    def anthropic_usage(self) -> Path:
        return self.folder / "anthropic-usage.jsonl"

    @property
    def ports(self) -> Path:
        return self.folder / "ports.json"

    def read_provider_keys(self) -> dict[str, str]:
        if not self.provider_keys.exists():
            return {}
        pairs = (line.split("=", 1) for line in self.provider_keys.read_text().splitlines() if "=" in line)
        return {name.strip(): value.strip() for name, value in pairs}

    def write_provider_keys(self, keys: dict[str, str]) -> None:
        write_private(self.provider_keys, "".join(f"{name}={value}\n" for name, value in sorted(keys.items())))

    def read_ports(self) -> dict[str, int]:
        try:
            found = json.loads(self.ports.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in found.items() if isinstance(v, int)} if isinstance(found, dict) else {}

    def write_ports(self, ports: dict[str, int]) -> None:
        self.ports.write_text(json.dumps(ports, sort_keys=True) + "\n")


def demo_policy_for_reports(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The demo's policy, for a report command given none - after saying so on stderr -
    with the demo's provider keys added to `environ` (those not set there already);
    None when there is no demo here."""
    files = DemoFiles.of_this_process()
    if not files.policy.exists():
        return None
    target = os.environ if environ is None else environ
    for name, value in files.read_provider_keys().items():
        target.setdefault(name, value)
    print(f"(no --policy or GATEWAY_POLICY: using the demo's {files.policy})", file=sys.stderr)
    return str(files.policy)


def write_private(path: Path, text: str) -> None:
    """A file only its owner may read (keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
