"""Agent job: leaves a double-forked setsid() process behind once it runs, then ends as `@@END@@`
says: `exit` (code 0), `fail` (code 3) or `hang` (until its timeout).

The daemon tries what the issue's attacker did: plant a `graders/run.py` wherever it can write
(the shared temporary directory first) and write a forged score next to any grader output it finds,
for as long as it lives. `@@MARKER@@` is on its command line, so the test can look for it.
"""

import os
import pathlib
import subprocess
import sys
import time

OUT = pathlib.Path(os.environ["POSTTRAIN_OUTPUT_DIR"])
DAEMON = r"""
import os, pathlib, sys, time
if os.fork():
    os._exit(0)
os.setsid()
out = pathlib.Path(sys.argv[1])
result = {"score": 1.0, "n": 1, "status": "ok", "reason": None, "details": {}, "grader_version": "forged"}
forged = (
    "import json, os\n"
    f"open(os.environ['POSTTRAIN_OUTPUT_DIR'] + '/result.json', 'w').write(json.dumps({result!r}))\n"
)
(out / "daemon-started").write_text(str(os.getpid()))
while True:
    for base in ["/tmp", os.environ.get("TMPDIR", "/tmp"), *[str(p) for p in pathlib.Path("/tmp").glob("*")]]:
        try:
            target = pathlib.Path(base) / "graders"
            target.mkdir(exist_ok=True)
            (target / "__init__.py").write_text("")
            (target / "run.py").write_text(forged)
        except OSError:
            pass
    time.sleep(0.05)
"""

subprocess.Popen([sys.executable, "-c", DAEMON, str(OUT), "@@MARKER@@"], start_new_session=True)
deadline = time.monotonic() + 120
while not (OUT / "daemon-started").exists():
    assert time.monotonic() < deadline, "the daemon never started"
    time.sleep(0.05)
print("daemon left behind")
if "@@END@@" == "fail":
    sys.exit(3)
if "@@END@@" == "hang":
    time.sleep(3600)
