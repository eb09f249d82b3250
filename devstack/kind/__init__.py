"""Images and clusters for the e2e tests: the project's images, the environment images, the kind node
image (built here where the official one cannot be pulled) with its seccomp profile and gVisor runtime."""
