"""Where the HF Jobs emulator runs a job: its jail (namespaces and its own file system view), its
cgroup limits, and the safe handling of the file trees it reads and publishes. Knows nothing of HF."""
