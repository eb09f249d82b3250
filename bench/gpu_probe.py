"""GPU probe: what a real post-training job needs of a GPU node, run under the launcher exactly as a
backend runs a loopback job (its own network namespace holding lo alone, the launcher's filter and
limits, uid 10000).

    sudo .venv/bin/python bench/gpu_probe.py [--memory-fraction 0.9] [--model DIR]

Three checks, each printed as `ok`, `FAILED <why>` or `skipped <why>`:

- an NCCL all-reduce across every visible GPU through torchrun (TCPStore and NCCL's bootstrap on
  127.0.0.1; one process per GPU);
- `vllm.LLM(...).generate` on a small local model (`--model`, a directory in Hugging Face format)
  when vllm is importable: vLLM's own process group on tcp://127.0.0.1;
- one CUDA allocation of `--memory-fraction` of the first GPU's memory, under the job's limits
  (the launcher bounds memory by RLIMIT_DATA, which CUDA's address-space reservations must fit).

Needs root (the network namespace and the launcher's privilege drop), a machine with an NVIDIA GPU
and torch built with CUDA. Where there is no GPU every check says `skipped: no CUDA device`, and the
exit code is 77 (the conventional "skipped"), never 0: a machine without a GPU proves nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from posttrain_launcher import JobSpec, Limits, launcher_command, launcher_env
from posttrain_launcher.host import job_interpreter

EXIT_SKIPPED = 77
LOOPBACK_ONLY = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]

JOB = r"""
import json, os, subprocess, sys
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
found = {}
import torch
if not torch.cuda.is_available():
    checks = ("nccl all-reduce", "vllm generate", "cuda allocation")
    found = {name: "skipped: no CUDA device" for name in checks}
else:
    gpus = torch.cuda.device_count()
    worker = os.path.join(os.environ["TMPDIR"], "nccl.py")
    open(worker, "w").write(
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('nccl')\n"
        "rank = dist.get_rank(); torch.cuda.set_device(rank)\n"
        "t = torch.ones(1, device='cuda') * (rank + 1)\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.item(), 'expected', sum(range(1, dist.get_world_size() + 1)), flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
               str(gpus), "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", worker]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    sums = [l for l in run.stdout.splitlines() if l.startswith("sum")]
    ok = run.returncode == 0 and sums and all(l.split()[1] == l.split()[3] for l in sums)
    found["nccl all-reduce"] = "ok" if ok else "FAILED " + (run.stderr[-1500:] or run.stdout[-500:])
    model = os.environ.get("GPU_PROBE_MODEL")
    try:
        import vllm
    except ImportError:
        found["vllm generate"] = "skipped: vllm is not importable"
    else:
        if not model:
            found["vllm generate"] = "skipped: no --model given"
        else:
            try:
                llm = vllm.LLM(model=model, gpu_memory_utilization=0.5, enforce_eager=True)
                text = llm.generate(["The capital of France is"])[0].outputs[0].text
                found["vllm generate"] = "ok" if text else "FAILED empty generation"
                del llm
            except Exception as exc:
                found["vllm generate"] = f"FAILED {type(exc).__name__}: {exc}"[:1500]
    fraction = float(os.environ["GPU_PROBE_FRACTION"])
    free, total = torch.cuda.mem_get_info(0)
    try:
        block = torch.empty(int(total * fraction), dtype=torch.uint8, device="cuda:0")
        block.fill_(1)
        torch.cuda.synchronize()
        found["cuda allocation"] = f"ok ({block.numel() >> 20} MiB of {total >> 20} MiB)"
        del block
    except Exception as exc:
        found["cuda allocation"] = f"FAILED {type(exc).__name__}: {exc}"[:1500]
json.dump(found, open(os.path.join(out, "result.json"), "w"))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--memory-fraction", type=float, default=0.9)
    parser.add_argument("--model", default="", help="a local model directory for the vLLM check")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the probe runs jobs as the launcher does: run it as root", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-probe-") as work:
        os.chmod(work, 0o755)
        root = Path(work, "root")
        (root / "outputs").mkdir(parents=True)
        spec = JobSpec(role="agent", script=JOB, output_dir="/outputs", network="loopback",
                       limits=Limits(max_output_bytes=1 << 20))  # fmt: skip
        env = launcher_env(spec, root=str(root), base=dict(os.environ))
        env |= {"GPU_PROBE_FRACTION": str(args.memory_fraction), "GPU_PROBE_MODEL": args.model}
        # The flavor, as a backend tells it: here, the whole machine (or MEMORY/CPU_CORES if set).
        env.setdefault("MEMORY", str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")))
        env.setdefault("CPU_CORES", str(os.cpu_count() or 1))
        python = job_interpreter(work)
        done = subprocess.run([*LOOPBACK_ONLY, *launcher_command(python)], env=env, text=True, check=False)
        result_file = root / "outputs" / "result.json"
        if done.returncode != 0 or not result_file.exists():
            print(f"the probe job failed (exit {done.returncode})", file=sys.stderr)
            return 1
        found: dict[str, str] = json.loads(result_file.read_text())
    for name, outcome in found.items():
        print(f"{name:18} {outcome}")
    if all(outcome.startswith("skipped") for outcome in found.values()):
        return EXIT_SKIPPED
    return 1 if any(outcome.startswith("FAILED") for outcome in found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
