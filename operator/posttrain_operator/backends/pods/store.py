"""The operator's own view of the artifact store: it prepares each job's output dir before the pod
exists and reads what jobs wrote, treating every file a job left as untrusted."""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from posttrain_operator.backends.base import ArtifactInfo, BackendError
from posttrain_operator.backends.pods.names import JOB_UID, output_subpath, relpath


def prepare_output_dir(store_path: str, prefix: str) -> None:
    """Create the job's output dir on the store, writable by uid 10000 and nobody else. The kubelet
    would otherwise create a missing subPath as root, and the launcher would refuse it."""
    target = Path(store_path, output_subpath(prefix))
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    try:
        target.mkdir(mode=0o700)
    except FileExistsError:
        return  # an earlier attempt made it; the job may already have written to it
    euid = os.geteuid()
    if euid == 0:
        os.chown(target, JOB_UID, JOB_UID)
    elif euid != JOB_UID:
        target.rmdir()
        raise BackendError(
            f"the operator runs as uid {euid}: it must run as root or uid {JOB_UID} to give jobs "
            "their output dirs on the artifact store",
            transient=False,
        )


def remove_store_tree(store_path: str, subpath: str) -> None:
    """Remove an operator-owned directory of the store (staged wheels); gone already is fine."""
    shutil.rmtree(Path(store_path, subpath), ignore_errors=True)


def list_artifacts(store_path: str, prefix: str, limit: int) -> list[ArtifactInfo]:
    """Regular files under the job's output dir; symlinks and special files are never followed."""
    root = Path(store_path, output_subpath(prefix))
    found: list[ArtifactInfo] = []
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(directory, name)
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue  # removed while we walked
            if stat.S_ISREG(info.st_mode):
                found.append(ArtifactInfo(path.relative_to(root).as_posix(), info.st_size))
            if len(found) >= limit:
                return found
    return found


def read_artifact_file(store_path: str, prefix: str, path: str, max_bytes: int) -> bytes:
    """Read a file a job wrote. The job is untrusted and may plant symlinks, FIFOs or swap
    directories while we read, so every component is opened relative to its parent with
    O_NOFOLLOW, and only a regular file is read."""
    parts = relpath(path).split("/")
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(Path(store_path, output_subpath(prefix)), flags_dir)
    except FileNotFoundError:
        raise FileNotFoundError(path) from None
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, flags_dir, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        raise FileNotFoundError(path) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise BackendError(
                f"artifact {path!r} is not a regular file (symlink?)", transient=False
            ) from exc
        raise
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise BackendError(f"artifact {path!r} is not a regular file", transient=False)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BackendError(f"artifact {path} is larger than {max_bytes} bytes", transient=False)
    return data
