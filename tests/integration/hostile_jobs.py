"""Job scripts an attacker would submit, shared by the emulator's and the operator's tests."""

FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
# Four processes of 320 MiB each, held (SIGSTOP) until the job's memory runs out.
MEMORY_BOMB = (
    "import os\n"
    "for _ in range(4):\n"
    "    if os.fork() == 0:\n"
    "        hoard = []\n"
    "        while True:\n"
    "            hoard.append(b'\\x01' * (8 << 20))\n"
    "            if len(hoard) >= 40:\n"
    "                break\n"
    "        os.kill(os.getpid(), 19)  # SIGSTOP: hold the memory until the cgroup runs out\n"
    "os.wait()\n"
)
# An answer.json of 200,000 nested arrays: Python's JSON parser raises RecursionError on it.
NESTED_ANSWER = (
    "import os\n"
    "with open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'answer.json'), 'w') as f:\n"
    "    f.write('[' * 200_000 + ']' * 200_000)\n"
)

# What CUDA does at start-up: reserve far more writable address space than the job will touch.
RESERVE_TWICE_THE_MEMORY = """
import mmap, os
memory = @@MEMORY@@
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux
region = mmap.mmap(-1, 2 * memory, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
region[: 1 << 20] = b"x" * (1 << 20)  # and touch a little of it
print("reserved", 2 * memory, flush=True)
"""
