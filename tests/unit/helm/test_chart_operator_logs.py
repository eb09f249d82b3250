"""`logging.format: json`: the operator's container command, as the chart renders it, makes the
installed kopf write one JSON object per line. The chart's args are run through kopf's own CLI with a
module in place of the handlers that logs one line and exits before any cluster is reached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.unit.helm.chart import FULL, HF_VALUES, main_container, render

MODULE = """
import logging, os
logging.getLogger("posttrain_operator.handlers").warning("loaded %s", "handlers", extra={"episode": "ep-1"})
os._exit(0)
"""


def _operator_line(values: dict[str, Any], tmp_path: Path) -> str:
    container = main_container(render(values), f"{FULL}-operator")
    command, args = container["command"], container["args"]
    assert command == ["python", "-m", "kopf"] and args[-2:] == ["-m", "posttrain_operator.handlers"]
    module = tmp_path / "one_line.py"
    module.write_text(MODULE)
    liveness = [a for a in args if a.startswith("--liveness=")]
    # The chart's args, the liveness port aside (nothing listens before the handlers load anyway).
    run = [sys.executable, "-m", "kopf", *[a for a in args[:-2] if a not in liveness], str(module)]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in (proc.stdout + proc.stderr).splitlines() if "loaded handlers" in x]
    return line


def test_json_format_makes_kopf_write_one_object_per_line(tmp_path: Path) -> None:
    record = json.loads(_operator_line({**HF_VALUES, "logging": {"format": "json"}}, tmp_path))
    assert record["message"] == "loaded handlers" and record["severity"] == "warn"
    assert record["timestamp"].endswith("+00:00") and record["episode"] == "ep-1"
