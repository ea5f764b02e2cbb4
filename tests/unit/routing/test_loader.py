"""Policy files: every example loads; each kind of mistake names file, line and field."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.cli import main as cli_main
from gateway.routing.loader import PolicyInvalid, load_policy_file, parse_policy
from tests.support.policies import alias_bomb

ROOT = Path(__file__).resolve().parents[3]
DIGEST = "sha256:" + "ab" * 32

MINIMAL = f"""\
version: 1
upstreams:
  local:
    kind: openai                      # any OpenAI-compatible HTTP API
    base_url: http://127.0.0.1:9100/v1
models:
  bench-model:
    upstream: local
    price: {{input: 0.15, cached_input: 0.075, output: 0.60}}   # USD per 1M tokens
tenants:
  acme:
    api_keys: ["{DIGEST}"]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyInvalid) as info:
        parse_policy(textwrap.dedent(text), "policy.yaml")
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_policy_loads(path: Path) -> None:
    policy = load_policy_file(path)
    assert policy.models, f"{path.name} defines no models"
    assert cli_main(["policy", "check", str(path)]) == 0


def test_minimal_design_policy_loads_as_written() -> None:
    policy = parse_policy(MINIMAL)
    assert str(policy.models["bench-model"].price.input) == "0.15"  # type: ignore[union-attr]
    assert policy.tenants["acme"].api_keys == [DIGEST]


def test_unknown_key_names_line_and_field() -> None:
    text = MINIMAL.replace("    upstream: local\n", "    upstream: local\n    colour: red\n")
    assert problems(text) == ["policy.yaml:9: models.bench-model.colour: unknown key"]


def test_wrong_type_names_line_and_field() -> None:
    text = MINIMAL.replace("input: 0.15,", "input: cheap,")
    [message] = problems(text)
    assert message.startswith("policy.yaml:9: models.bench-model.price.input: ")
    assert "decimal" in message.lower()


def test_duplicate_model_is_rejected_not_collapsed() -> None:
    text = MINIMAL.replace("tenants:", "  bench-model:\n    upstream: local\ntenants:")
    assert problems(text) == ["policy.yaml:10: models.bench-model: duplicate key `bench-model` (first defined at line 7)"]


def test_dangling_upstream_reference() -> None:
    text = MINIMAL.replace("    upstream: local", "    upstream: elsewhere")
    assert problems(text) == [
        "policy.yaml:8: models.bench-model.upstream: names upstream `elsewhere`, which is not defined under `upstreams`"
    ]


def test_route_chain_must_name_models() -> None:
    text = MINIMAL + "routes:\n  auto:\n    chain: [bench-model, missing-model]\n"
    assert problems(text) == [
        "policy.yaml:15: routes.auto.chain[1]: names model `missing-model`, which is not defined under `models`"
    ]


def test_raw_key_instead_of_digest_is_refused() -> None:
    [message] = problems(MINIMAL.replace(DIGEST, "sk-live-123"))
    assert message.startswith("policy.yaml:12: tenants.acme.api_keys")
    assert "gateway keys new" in message


def test_invalid_yaml_reports_line() -> None:
    [message] = problems("version: 1\nupstreams: [\n")
    assert message.startswith("policy.yaml:3: not valid YAML")


def test_a_tag_that_would_run_code_is_refused_with_its_line() -> None:
    [message] = problems("version: 1\nupstreams: !!python/object/apply:os.system [echo]\n")
    assert message.startswith("policy.yaml:2: not valid YAML") and "python/object/apply:os.system" in message


@pytest.mark.parametrize("url", ["ftp://h/v1", "localhost:9100/v1", "http://", "http://h:99999/v1", "http://h ost/v1"])
def test_an_upstream_address_that_is_not_an_http_url_is_refused(url: str) -> None:
    [message] = problems(MINIMAL.replace("http://127.0.0.1:9100/v1", url))
    assert message.startswith("policy.yaml:5: upstreams.local.base_url")


def test_policy_check_exits_1_with_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("kind: openai", "kind: carrier-pigeon"))
    assert cli_main(["policy", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:4: upstreams.local.kind:" in err


def test_committed_json_schema_matches_the_policy_models(tmp_path: Path) -> None:
    fresh = tmp_path / "schema.json"
    assert cli_main(["policy", "schema", "--output", str(fresh)]) == 0
    committed = ROOT / "policies" / "policy.schema.json"
    assert committed.read_text() == fresh.read_text(), "run `gateway policy schema --output policies/policy.schema.json`"


# -- what a policy file may be: its size and the document its aliases make ------------

def test_an_alias_bomb_is_refused_by_policy_check_with_file_and_line(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb(9))
    assert len(bomb.read_bytes()) < 400
    # Its own process, with a hang guard: before the bound it ran two minutes into 11 GB.
    checked = subprocess.run([sys.executable, "-m", "gateway", "policy", "check", str(bomb)],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stderr.startswith(f"{bomb}:6: i[0][0][0]: the aliases here make ")
    assert "at most 100,000 may come from aliases" in checked.stderr


def test_an_alias_bomb_in_a_section_is_refused_before_the_schema() -> None:
    [message] = problems(MINIMAL + "routes:\n" + textwrap.indent(alias_bomb(7), "  "))
    assert message.startswith("policy.yaml:19: routes.g[0]: the aliases here make ")


def test_anchors_aliases_and_merge_keys_still_work() -> None:
    policy = parse_policy(textwrap.dedent(f"""\
        version: 1
        upstreams:
          local: {{kind: openai, base_url: "http://127.0.0.1:9100/v1"}}
        models:
          bench-model: &model
            upstream: local
            price: &price {{input: 0.15, output: 0.60}}
            limits: &limits {{rpm: 60, tpm: 100000}}
          copy: *model
          merged:
            <<: *model
            max_output_tokens: 100
          small:
            upstream: local
            price: *price
        tenants:
          acme:
            api_keys: ["{DIGEST}"]
            limits: *limits
        """))
    assert policy.models["copy"] == policy.models["bench-model"]
    assert policy.models["merged"].max_output_tokens == 100
    assert policy.models["merged"].limits == policy.models["bench-model"].limits
    assert policy.models["small"].price == policy.models["bench-model"].price
    assert policy.tenants["acme"].limits is not None and policy.tenants["acme"].limits.rpm == 60


@pytest.mark.parametrize("section,expected", [
    ("routes: &r\n  loop: *r\n", "policy.yaml:13: routes.loop: this alias names a node that contains it"),
    ("routes:\n  loop: &l [*l]\n", "policy.yaml:14: routes.loop[0]: this alias names a node that contains it"),
])
def test_an_alias_inside_the_node_it_names_is_refused(section: str, expected: str) -> None:
    [message] = problems(MINIMAL + section)
    assert message.startswith(expected)


def test_nesting_past_64_levels_is_refused() -> None:
    [message] = problems(MINIMAL + "routes:\n  deep: " + "[" * 70 + "]" * 70 + "\n")
    assert message.startswith("policy.yaml:14: routes.deep[0]") and message.endswith("nests more than 64 levels deep")
    [schema] = problems(MINIMAL + "routes:\n  deep: " + "[" * 60 + "]" * 60 + "\n")
    assert "levels deep" not in schema, "60 levels are read (and then found not to be a route)"


def test_a_file_over_4_mib_is_refused_naming_it(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(MINIMAL + ("# padding\n" * 420_000))
    with pytest.raises(PolicyInvalid) as info:
        load_policy_file(big)
    assert str(info.value) == f"{big}: the file is over 4 MiB; a policy or pricing file is a few KiB"


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(MINIMAL.encode() + b"# caf\xe9\n")
    with pytest.raises(PolicyInvalid) as info:
        load_policy_file(latin)
    assert str(info.value).startswith(f"{latin}: the file is not UTF-8 text")
