"""An HF Jobs API emulator that runs each job for real on this machine.

with HfEmulator(tmp_dir) as emu:
    api = HfApi(endpoint=emu.url, token=emu.token)
    api.run_job(image="...", command=["python", "-c", "print(1)"], namespace=emu.namespace)

Repos that jobs mount are published with the same client (`create_repo`, `upload_folder`,
`create_tag`; `hub_api.py`), or registered from a host directory (`emu.repos.register`).
"""

from devstack.hf_emulator import routes
from devstack.hf_emulator.emulator import DEFAULT_NAMESPACE, DEFAULT_TOKEN, HfEmulator
from devstack.hf_emulator.faults import FAULT_KINDS, Fault
from devstack.hf_emulator.hardware import FLAVORS
from devstack.hf_emulator.records import BillingRecord, RecordedRequest
from devstack.hf_emulator.repos import RepoStore

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_TOKEN",
    "FAULT_KINDS",
    "FLAVORS",
    "BillingRecord",
    "Fault",
    "HfEmulator",
    "RecordedRequest",
    "RepoStore",
    "routes",
]
