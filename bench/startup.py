"""Start-up to first answer, measured over many starts, and compared between source trees.

Starts the hosted simulator once, then a gateway on the other core (bench/placement.py) again and again, each
with a fresh SQLite ledger (a new GATEWAY_VAR_DIR, so every start creates its schema)
and the benchmarks' policy (`bench/gwstack.py`). Each start records spawn -> /healthz
200 and spawn -> the first 200 from /v1/chat/completions, then stops the gateway. Given several trees (checkouts of
the project, e.g. `git worktree add /tmp/before <commit>`), the starts alternate between
them (A B, B A, ...), so that the machine's drift falls on each alike. A tree is run
with this venv's packages: it must need no package this venv lacks.

    .venv/bin/python bench/startup.py                               # this checkout, 10 starts
    .venv/bin/python bench/startup.py --tree /tmp/before --tree .   # 10 starts each, alternating

Prints the median, minimum and maximum per tree and writes bench/out/startup-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `gateway` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import placement, procs
from bench.gwstack import CHAT_PATH, READY_TIMEOUT_S, SIM_KEY, Stack, base_policy, workspace
from bench.placement import Placement
from bench.report import ROOT, add_output_options, args_config, markdown_table, run_header, write_json
from bench.workload import chat_body


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", type=Path, help="a checkout to start the gateway from (repeatable;"
                        " default: this one)")
    parser.add_argument("--runs", type=int, default=10, help="starts per tree (default 10)")
    add_output_options(parser, pinning=True)
    args = parser.parse_args(argv)
    args.tree = [tree.resolve() for tree in args.tree or [ROOT]]
    missing = [str(tree) for tree in args.tree if not (tree / "gateway" / "__main__.py").is_file()]
    if missing:
        parser.error(f"--tree: no gateway package in {', '.join(missing)}")
    if not 1 <= args.runs <= 200:
        parser.error("--runs: from 1 to 200")
    return args


class Starts:
    """The simulator, kept up, and one gateway start after another in front of it."""

    def __init__(self, workdir: Path, exits: ExitStack, place: Placement | None) -> None:
        self.workdir, self.exits, self.place = workdir, exits, place
        simulator = Stack(workdir, exits, place)
        self.sim_port = simulator.start_simulator([])
        assert simulator.sim is not None
        # Its first answer loads its tokenizer: take it now, outside every gateway's figure.
        procs.wait_until(simulator.sim, self.sim_port, "POST", CHAT_PATH, READY_TIMEOUT_S, body=chat_body(False),
                         headers={"Authorization": f"Bearer {SIM_KEY}", "Content-Type": "application/json"})
        self.count = 0

    def once(self, tree: Path) -> dict[str, float]:
        """A start with a ledger of its own (a new GATEWAY_VAR_DIR), then a stop."""
        self.count += 1
        stack = Stack(self.workdir, self.exits, self.place, tag=f"-{self.count}")
        healthz_s = stack.start_gateway(base_policy(self.sim_port, stack.digest), tree)
        assert stack.gateway is not None
        try:
            first_s = procs.wait_until(stack.gateway, stack.gateway_port, "POST", CHAT_PATH, READY_TIMEOUT_S,
                                       body=chat_body(False), headers=stack.client_headers())
        finally:
            stack.gateway.stop()
        return {"healthz_s": round(healthz_s, 4), "first_chat_200_s": round(first_s, 4)}


def summary(tree: Path, starts: list[dict[str, float]]) -> dict[str, Any]:
    first = [s["first_chat_200_s"] for s in starts]
    return {"tree": str(tree), "runs": len(first), "median_s": round(statistics.median(first), 3),
            "min_s": round(min(first), 3), "max_s": round(max(first), 3),
            "healthz_median_s": round(statistics.median(s["healthz_s"] for s in starts), 3)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    place = placement.from_args(args)
    report: dict[str, Any] = run_header("startup", args_config(args) | {"tree": [str(t) for t in args.tree],
                                                                         "pinning": placement.report(place)})
    results: dict[Path, list[dict[str, float]]] = {tree: [] for tree in args.tree}
    with workspace("gateway-startup-") as workdir, ExitStack() as exits:
        starts = Starts(workdir, exits, place)
        placement.join_load_core(place)
        for tree in args.tree:  # the first start of a checkout compiles its bytecode: not counted
            starts.once(tree)
        for run in range(args.runs):
            for tree in args.tree if run % 2 == 0 else args.tree[::-1]:
                results[tree].append(starts.once(tree))
    report["trees"] = [summary(tree, runs) | {"starts": runs} for tree, runs in results.items()]
    columns = [("tree", "tree"), ("runs", "runs"), ("first chat 200, median s", "median_s"), ("min s", "min_s"),
               ("max s", "max_s"), ("/healthz 200, median s", "healthz_median_s")]
    print(markdown_table(columns, report["trees"]))
    print(f"\nJSON: {write_json('startup', report, args.out_dir)}")
    return 0


if __name__ == "__main__":
    procs.run_script(main)
