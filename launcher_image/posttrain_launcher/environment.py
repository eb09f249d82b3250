"""The job's environment: the launcher's, scrubbed of anything credential-like, plus the job's own."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .spec import JobSpec, input_env_name

# Matched anywhere in the name, case-insensitively. Over-matching (KEYBOARD_LAYOUT) costs nothing.
_SECRET_WORDS = re.compile(
    r"TOKEN|SECRET|KEY|PASS|PWD$|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|NETRC",
    re.IGNORECASE,
)
# Whole families that configure access to some service; none is any use without a network.
_SECRET_PREFIXES = (
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "GCP_",
    "GCLOUD_",
    "CLOUDSDK_",
    "HF_",
    "HUGGING_FACE_",
    "HUGGINGFACE_",
    "GITHUB_",
    "GH_",
    "GITLAB_",
    "DOCKER_",
    "KUBERNETES_",
    "VAULT_",
    "PIP_",
    "UV_",
    "NPM_",
    "SSH_",
    "POSTTRAIN_",
)
# A value with user:password@ in a URL is a credential whatever its name (DATABASE_URL=...).
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@]*@")
# PWD is the shell's working directory, not a password.
_KEEP = frozenset({"PWD", "OLDPWD"})


def is_secret_name(name: str) -> bool:
    if name in _KEEP:
        return False
    upper = name.upper()
    return bool(_SECRET_WORDS.search(upper)) or upper.startswith(_SECRET_PREFIXES)


def scrub(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in environ.items()
        if not is_secret_name(k) and not _URL_USERINFO.search(v) and "\x00" not in k + v
    }


def job_environment(
    environ: Mapping[str, str],
    spec: JobSpec,
    *,
    inputs: Mapping[str, str],
    output_dir: str,
    private: str,
    package_dir: str | None,
) -> dict[str, str]:
    """`inputs` and `output_dir` are host paths (POSTTRAIN_ROOT applied); `private` is job-owned."""
    env = scrub(environ)
    home = os.path.join(private, "home")
    pythonpath = [package_dir] if package_dir else []
    # The image puts the launcher and graders on PYTHONPATH; grader scripts import them.
    pythonpath += [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        {
            "HOME": home,
            "TMPDIR": os.path.join(private, "tmp"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "PYTHONNOUSERSITE": "1",
            "PYTHONUNBUFFERED": "1",
            # There is no network: libraries that would try the Hub fail fast instead of retrying.
            "HF_HUB_OFFLINE": "1",
            "POSTTRAIN_ROLE": spec.role,
            "POSTTRAIN_OUTPUT_DIR": output_dir,
            "POSTTRAIN_NETWORK": spec.network,
        }
    )
    if spec.network == "loopback":
        # lo is the only interface: gloo and NCCL would otherwise look for one by the host's name.
        env.update({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"})
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    else:
        env.pop("PYTHONPATH", None)
    for name, path in inputs.items():
        env[input_env_name(name)] = path
    return env
