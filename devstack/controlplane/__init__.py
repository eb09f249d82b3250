"""The control plane the integration tests run against: etcd and the Kubernetes control-plane
binaries, with their PKI and kubeconfigs (`python -m devstack cluster up|down|status|env`)."""
