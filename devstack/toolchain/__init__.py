"""Binaries the control plane and the kind images are made of: fetched or built with Go, cached by
version, and where they live on this machine."""
