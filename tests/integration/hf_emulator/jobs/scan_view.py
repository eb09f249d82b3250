"""Agent job: reads everything it can reach and reports where any of the needles turned up.

Reads every regular file of its view except the read-only system and library mounts (reported
separately as the mount table, which the test checks), and /proc's environ and cmdline of every
process it can see. Needles: the emulator's token, the hidden split's marker, its own input's marker.
"""

import json
import os

OUT = os.environ["POSTTRAIN_OUTPUT_DIR"]
# This job's own script, which the launcher copies into its outputs: it holds the needles by design.
OWN_SCRIPT = os.path.join(OUT, "posttrain-script.py")
NEEDLES = {"token": "@@TOKEN@@", "hidden": "@@HIDDEN_MARKER@@", "own": "@@OWN_MARKER@@"}
SKIP_READING = json.loads(bytes.fromhex("@@SKIP@@"))  # library mounts: listed, not read
MAX_BYTES = 8 << 20

mounts = []
with open("/proc/self/mountinfo") as fh:
    for line in fh:
        fields = line.split()
        mounts.append(fields[4])

found: dict[str, list[str]] = {name: [] for name in NEEDLES}
files = 0


def check(path: str, data: bytes) -> None:
    for name, needle in NEEDLES.items():
        if needle.encode() in data:
            found[name].append(path)


for top in sorted(os.listdir("/")):
    if top in ("proc", "sys"):
        continue
    for dirpath, dirnames, filenames in os.walk("/" + top):
        if any(dirpath == s or dirpath.startswith(s + "/") for s in SKIP_READING):
            dirnames[:] = []
            continue
        for name in filenames:
            path = os.path.join(dirpath, name)
            check(path, path.encode())
            if os.path.realpath(path) == os.path.realpath(OWN_SCRIPT):
                continue
            try:
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as fh:
                    check(path, fh.read(MAX_BYTES))
                files += 1
            except OSError:
                continue

for entry in os.listdir("/proc"):
    if entry.isdigit():
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{entry}/{name}", "rb") as fh:
                    check(f"/proc/{entry}/{name}", fh.read())
            except OSError:
                continue

with open(os.path.join(OUT, "result.json"), "w") as fh:
    json.dump({"mounts": mounts, "found": found, "files_read": files}, fh)
