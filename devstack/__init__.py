"""Devstack: a real Kubernetes control plane and an HF Jobs API emulator on one machine."""
