"""The Episode and AgentJob resources as typed models: the one source of the CRDs and of every parse."""
