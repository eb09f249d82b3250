"""The requirement policy: index names and versions only, checked before pip ever sees them."""

from __future__ import annotations

from pathlib import Path

import pytest
from posttrain_launcher.packages import (
    InstallError,
    PackagePolicyError,
    check_lock,
    check_requirements,
    pip_command,
)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("six", "six"),
        ("six==1.17.0", "six==1.17.0"),
        ("Six_Pack.Ext==1.0", "six-pack-ext==1.0"),
        ("numpy>=2,<3", "numpy<3,>=2"),
        ("numpy >= 2.0, < 3", "numpy<3,>=2.0"),
        ("torch==2.5.1+cpu", "torch==2.5.1+cpu"),
        ("peft~=0.13.0", "peft~=0.13.0"),
        ("trl!=0.9.*", "trl!=0.9.*"),
    ],
)
def test_accepted_requirements_are_normalised(raw: str, want: str) -> None:
    assert check_requirements([raw]) == [want]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("--index-url=https://evil.example/simple", id="index-url"),
        pytest.param("--extra-index-url https://evil.example", id="extra-index-url"),
        pytest.param("-i https://evil.example", id="short index"),
        pytest.param("-e .", id="editable"),
        pytest.param("-e", id="bare -e"),
        pytest.param("-r requirements.txt", id="requirements file"),
        pytest.param("--pre", id="bare option"),
        pytest.param("six @ https://evil.example/six.whl", id="URL requirement"),
        pytest.param("https://evil.example/six-1.0-py3-none-any.whl", id="bare URL"),
        pytest.param("git+https://github.com/x/y", id="VCS"),
        pytest.param("./pkg", id="relative path"),
        pytest.param("/opt/wheels/six-1.0-py3-none-any.whl", id="absolute path"),
        pytest.param("six; python_version > '3'", id="environment marker"),
        pytest.param("six;python_version>'3'", id="marker without spaces"),
        pytest.param("six[all]", id="extras"),
        pytest.param("six===1.0", id="arbitrary equality"),
        pytest.param("six==1.0 --hash=sha256:00", id="hash option"),
        pytest.param("six\n--index-url=https://evil.example", id="newline"),
        pytest.param("six #comment", id="comment"),
        pytest.param("", id="empty"),
        pytest.param("-six", id="leading dash"),
        pytest.param("six==", id="operator without version"),
    ],
)
def test_refused_requirements(raw: str) -> None:
    with pytest.raises(PackagePolicyError):
        check_requirements([raw])


def test_list_and_item_bounds_and_duplicates() -> None:
    with pytest.raises(PackagePolicyError, match="at most 32"):
        check_requirements([f"p{i}" for i in range(33)])
    assert len(check_requirements([f"p{i}" for i in range(32)])) == 32
    with pytest.raises(PackagePolicyError, match="200"):
        check_requirements(["a" * 201])
    with pytest.raises(PackagePolicyError, match="twice"):
        check_requirements(["Six", "six==1.0"])


def test_pip_gets_wheels_only_no_deps_and_no_options_after_the_separator() -> None:
    cmd = pip_command(["six==1.17.0"], "/scratch/packages", python="python")
    assert cmd[:4] == ["python", "-m", "pip", "install"]
    assert "--only-binary=:all:" in cmd
    assert "--no-deps" in cmd
    assert cmd[cmd.index("--target") + 1] == "/scratch/packages"
    assert cmd[-2:] == ["--", "six==1.17.0"]
    assert not any("index" in arg or "find-links" in arg for arg in cmd)


def test_a_backends_lock_installs_every_pinned_wheel_by_hash_and_must_pin_what_was_asked(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        f"ptprobe==1.0 --hash=sha256:{'a' * 64}\nptdep==2.1 --hash=sha256:{'b' * 64}\n"
        "# numpy==2.4.6 (the image's)\n"
    )
    check_lock(["PtProbe>=1", "numpy>=2"], str(lock))  # numpy: the image's, said so by the lock
    cmd = pip_command(["PtProbe>=1"], "/t", python="/py", lock=str(lock))
    assert cmd[-3:] == ["--require-hashes", "-r", str(lock)] and "PtProbe>=1" not in cmd
    assert "--no-deps" in cmd and "--only-binary=:all:" in cmd
    with pytest.raises(InstallError, match=r"does not pin \['pandas'\]"):
        check_lock(["ptprobe", "pandas"], str(lock))
    with pytest.raises(InstallError, match="cannot be read"):
        check_lock(["ptprobe"], str(tmp_path / "missing"))
