"""The import contracts in `.importlinter` hold: layers only import downwards, the
simulators stand apart, and no module imports itself back through others. Imports
inside functions and under TYPE_CHECKING count like any other."""

from __future__ import annotations

import copy
import graphlib
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import grimp
import pytest
from importlinter import configuration
from importlinter.application import output
from importlinter.application.use_cases import lint_imports, read_user_options
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".importlinter"
CONTRACT_TYPES: dict[str, type[Contract]] = {
    "layers": LayersContract, "forbidden": ForbiddenContract, "acyclic_siblings": AcyclicSiblingsContract,
}
configuration.configure()  # import-linter's readers and graph builder, as its CLI sets them up


@cache
def gateway_graph() -> grimp.ImportGraph:
    """The package's imports as the contracts see them (tests copy it before changing it)."""
    return grimp.build_graph("gateway", cache_dir=None)


def contracts() -> dict[str, Contract]:
    """The contracts in `.importlinter`, by id, ready to check against any graph."""
    options = read_user_options(str(CONFIG))
    return {o["id"]: CONTRACT_TYPES[o["type"]](name=o["name"], session_options=options.session_options, contract_options=o)
            for o in options.contracts_options}


def broken_report(contract: Contract, graph: grimp.ImportGraph) -> str | None:
    """What import-linter says about a broken contract; None when it is kept."""
    check = contract.check(graph, verbose=False)
    if check.kept:
        return None
    with output.console.capture() as captured:
        contract.render_broken_contract(check)
    return captured.get()


def with_import(importer: str, imported: str) -> grimp.ImportGraph:
    graph = copy.deepcopy(gateway_graph())
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    return graph


def module_cycle(graph: grimp.ImportGraph) -> list[str] | None:
    """One chain of imports that leads a module back to itself, if there is any."""
    sorter = graphlib.TopologicalSorter({m: graph.find_modules_directly_imported_by(m) for m in graph.modules})
    try:
        sorter.prepare()
    except graphlib.CycleError as cycle:
        return list(cycle.args[1])
    return None


def test_every_contract_is_kept() -> None:
    with output.console.capture() as captured:
        kept = lint_imports(str(CONFIG), cache_dir=None, no_logo=True, is_debug_mode=True)
    report = captured.get()
    assert kept, report
    assert f"Contracts: {len(contracts())} kept, 0 broken." in report, report


def test_no_module_imports_itself_back() -> None:
    assert module_cycle(gateway_graph()) is None


@pytest.mark.parametrize(("importer", "imported"), [
    ("gateway.types.usage", "gateway.pipeline.runner"),  # a leaf reaching up
    ("gateway.routing.loader", "gateway.accounting.prices"),  # the loader checking prices itself
    ("gateway.accounting.hold_and_settle", "gateway.pipeline.runner"),  # a stage calling the runner
    ("gateway.pipeline.runner", "gateway.api.hot_paths"),  # anything importing the HTTP layer
    ("gateway.caching.response_cache", "gateway.accounting.hold_and_settle"),  # one stage calling another
])
def test_an_upward_or_sideways_import_breaks_the_layers(importer: str, imported: str) -> None:
    layers = contracts()["layers"]
    assert broken_report(layers, copy.deepcopy(gateway_graph())) is None
    report = broken_report(layers, with_import(importer, imported))
    assert report is not None and f"{importer} -> {imported}" in report


def test_a_simulator_leaning_on_the_gateway_breaks_its_contract() -> None:
    report = broken_report(contracts()["simulators"], with_import("gateway.sim.hosted", "gateway.accounting.prices"))
    assert report is not None and "gateway.sim.hosted -> gateway.accounting.prices" in report


def test_a_cycle_between_modules_of_a_package_is_found() -> None:
    graph = with_import("gateway.accounting.reconcile_report", "gateway.accounting.reconcile")
    assert set(module_cycle(graph) or ()) == {"gateway.accounting.reconcile", "gateway.accounting.reconcile_report"}
    report = broken_report(contracts()["acyclic"], graph)
    assert report is not None and "No cycles are allowed in gateway.accounting" in report
    assert ".reconcile_report -> .reconcile (1 import)" in report


@pytest.mark.parametrize(("module", "hidden_import"), [
    ("routing/loader.py", "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                          "    from gateway.accounting.prices import PriceCatalog\n"),
    ("types/usage.py", "def _late() -> None:\n    from gateway.pipeline import runner\n"),
])
def test_an_import_hidden_in_a_function_or_type_checking_still_counts(tmp_path: Path, module: str, hidden_import: str) -> None:
    # A copy of the package with one import hidden the way cycles used to be hidden,
    # checked as a developer would check it: `lint-imports` in a fresh process.
    shutil.copytree(ROOT / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(CONFIG, tmp_path / ".importlinter")
    with (tmp_path / "gateway" / module).open("a") as source:
        source.write("\n\n" + hidden_import)
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
         "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()"],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": ""}, capture_output=True, text=True, timeout=120,
    )
    importer = "gateway." + module.removesuffix(".py").replace("/", ".")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Layers: each imports only from the layers below it BROKEN" in result.stdout
    assert importer in result.stdout
