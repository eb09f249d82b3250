"""Reconcilers: each one reads, decides with a pure function, acts, then writes status."""
