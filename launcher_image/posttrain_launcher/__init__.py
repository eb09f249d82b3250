"""The entrypoint of every agent and grader job: wheels-only install, then a locked-down script.

Imports only the standard library, pydantic, packaging and pyseccomp (it runs inside the job image).
"""

from .host import launcher_command, launcher_env
from .spec import JobSpec, Limits

__all__ = ["JobSpec", "Limits", "launcher_command", "launcher_env"]
