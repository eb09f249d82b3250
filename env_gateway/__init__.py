"""env_gateway: the agents' MCP and OpenEnv surface of posttrain-operator."""

__version__ = "0.1.0"
