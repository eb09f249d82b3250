"""The hardware table served by `GET /api/jobs/hardware` and used for billing.

Prices are the $/hour list of `docs/hf-jobs-api.md` converted to the wire's unit, micro-USD per minute
(rounded to an integer, as the real API sends it: cpu-basic $0.01/h -> 167). CPU, RAM and accelerator
descriptions are indicative only: nothing in this project depends on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flavor:
    name: str
    pretty_name: str
    usd_per_hour: float
    cpu: str
    ram: str
    gpu_model: str | None = None
    gpu_count: int = 0
    gpu_vram: str = ""

    @property
    def unit_cost_micro_usd(self) -> int:
        return round(self.usd_per_hour * 1_000_000 / 60)

    @property
    def cpu_cores(self) -> int:
        return int(self.cpu.split()[0])

    def to_wire(self) -> dict[str, Any]:
        accelerator = None
        if self.gpu_model is not None:
            accelerator = {
                "type": "gpu",
                "model": self.gpu_model,
                "quantity": str(self.gpu_count),
                "vram": self.gpu_vram,
                "manufacturer": "Nvidia",
            }
        return {
            "name": self.name,
            "prettyName": self.pretty_name,
            "cpu": self.cpu,
            "ram": self.ram,
            "ephemeralStorage": "50 GB",
            "accelerator": accelerator,
            "unitCostMicroUSD": self.unit_cost_micro_usd,
            "unitCostUSD": self.unit_cost_micro_usd / 1_000_000,
            "unitLabel": "minute",
        }


def _gpu(name: str, pretty: str, price: float, cpu: str, ram: str, model: str, n: int, vram: int) -> Flavor:
    return Flavor(name, pretty, price, cpu, ram, model, n, f"{vram * n} GB")


FLAVORS: dict[str, Flavor] = {
    f.name: f
    for f in [
        Flavor("cpu-basic", "CPU Basic", 0.01, "2 vCPU", "16 GB"),
        Flavor("cpu-upgrade", "CPU Upgrade", 0.03, "8 vCPU", "32 GB"),
        Flavor("cpu-performance", "CPU Performance", 1.90, "32 vCPU", "256 GB"),
        Flavor("cpu-xl", "CPU XL", 1.00, "16 vCPU", "124 GB"),
        _gpu("t4-small", "Nvidia T4 - small", 0.40, "4 vCPU", "15 GB", "T4", 1, 16),
        _gpu("t4-medium", "Nvidia T4 - medium", 0.60, "8 vCPU", "30 GB", "T4", 1, 16),
        _gpu("l4x1", "1x Nvidia L4", 0.80, "8 vCPU", "30 GB", "L4", 1, 24),
        _gpu("l4x4", "4x Nvidia L4", 3.80, "48 vCPU", "186 GB", "L4", 4, 24),
        _gpu("l40sx1", "1x Nvidia L40S", 1.80, "8 vCPU", "62 GB", "L40S", 1, 48),
        _gpu("l40sx4", "4x Nvidia L40S", 8.30, "48 vCPU", "382 GB", "L40S", 4, 48),
        _gpu("l40sx8", "8x Nvidia L40S", 23.50, "192 vCPU", "1534 GB", "L40S", 8, 48),
        _gpu("a10g-small", "Nvidia A10G - small", 1.00, "4 vCPU", "15 GB", "A10G", 1, 24),
        _gpu("a10g-large", "Nvidia A10G - large", 1.50, "12 vCPU", "46 GB", "A10G", 1, 24),
        _gpu("a10g-largex2", "2x Nvidia A10G - large", 3.00, "24 vCPU", "92 GB", "A10G", 2, 24),
        _gpu("a10g-largex4", "4x Nvidia A10G - large", 5.00, "48 vCPU", "184 GB", "A10G", 4, 24),
        _gpu("a100-large", "Nvidia A100 - large", 2.50, "12 vCPU", "142 GB", "A100", 1, 80),
        _gpu("a100x4", "4x Nvidia A100", 10.00, "48 vCPU", "568 GB", "A100", 4, 80),
        _gpu("a100x8", "8x Nvidia A100", 20.00, "96 vCPU", "1136 GB", "A100", 8, 80),
        _gpu("h200", "Nvidia H200", 5.00, "23 vCPU", "256 GB", "H200", 1, 141),
        _gpu("h200x2", "2x Nvidia H200", 10.00, "46 vCPU", "512 GB", "H200", 2, 141),
        _gpu("h200x4", "4x Nvidia H200", 20.00, "92 vCPU", "1024 GB", "H200", 4, 141),
        _gpu("h200x8", "8x Nvidia H200", 40.00, "184 vCPU", "2048 GB", "H200", 8, 141),
        _gpu("rtx-pro-6000", "Nvidia RTX PRO 6000", 2.75, "23 vCPU", "184 GB", "RTX PRO 6000", 1, 96),
        _gpu("rtx-pro-6000x2", "2x Nvidia RTX PRO 6000", 5.50, "46 vCPU", "368 GB", "RTX PRO 6000", 2, 96),
        _gpu("rtx-pro-6000x4", "4x Nvidia RTX PRO 6000", 11.00, "92 vCPU", "736 GB", "RTX PRO 6000", 4, 96),
        _gpu("rtx-pro-6000x8", "8x Nvidia RTX PRO 6000", 22.00, "184 vCPU", "1472 GB", "RTX PRO 6000", 8, 96),
    ]
}


def hardware_list() -> list[dict[str, Any]]:
    return [flavor.to_wire() for flavor in FLAVORS.values()]
