"""The images install the task plugins the project ships with `tasks/install_plugin.py`: what it leaves
must be found by the registry through the entry point, and imported from where it was put."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_an_installed_plugin_is_registered_from_its_target(tmp_path: Path) -> None:
    installer = REPO / "tasks" / "install_plugin.py"
    subprocess.run([sys.executable, str(installer), str(REPO / "tasks" / "gsm8k"), str(tmp_path)], check=True)
    probe = (
        "import json, posttrain_task_gsm8k\n"
        "from graders.tasks import registered_task\n"
        "r = registered_task('gsm8k')\n"
        "print(json.dumps([posttrain_task_gsm8k.__file__, r.source]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    module_file, source = json.loads(out.stdout)
    assert Path(module_file).is_relative_to(tmp_path)
    assert source == "entry point gsm8k = posttrain_task_gsm8k:PLUGIN"
