"""bench/server_glue.py: every server answers the benchmark's request alike, and a run
reports each of them and what each costs over the bare one."""

from __future__ import annotations

import json
from pathlib import Path

from bench.server_glue import SERVERS, main


def test_a_short_run_measures_every_server(tmp_path: Path) -> None:
    status = main(["--rounds", "1", "--duration", "0.3", "--warmup", "0", "--concurrency", "1,2", "--no-pin",
                   "--out-dir", str(tmp_path)])

    assert status == 0
    [report_path] = tmp_path.glob("server-glue-*.json")
    report = json.loads(report_path.read_text())
    measured = {(run["server"], run["concurrency"]) for run in report["runs"] if run["completed"] > 0 and not run["errors"]}
    assert measured == {(server, c) for server in SERVERS for c in (1, 2)}
    assert [(row["concurrency"], row["server"]) for row in report["summary"]] == [
        (1, "uvicorn"), (1, "ours"), (2, "uvicorn"), (2, "ours")]
    assert all(isinstance(row["cpu_us"], float) for row in report["summary"])
