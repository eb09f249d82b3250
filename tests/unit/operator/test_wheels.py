"""The pods backend stages a job's packages itself (its pods have no egress): the wheel chosen for
each requirement, the index's hash checked, a read-only directory made whole or not at all, and
the pod told to install from it with no index. The index is a real HTTP server on loopback."""

from __future__ import annotations

import hashlib
import json
import stat
import zipfile
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from packaging.requirements import Requirement
from packaging.tags import Tag
from posttrain_operator.backends.base import BackendError, JobRequest, PackagePin
from posttrain_operator.backends.pods import Flavor, PodsBackend, PodsConfig
from posttrain_operator.backends.pods.manifests import pod_body
from posttrain_operator.backends.pods.names import STORE_RO_VOLUME, wheels_subpath
from posttrain_operator.backends.wheel_choice import (
    IndexFile,
    StagingError,
    choose,
    parse_index_page,
    target_tags,
)
from posttrain_operator.backends.wheels import WHEELS_MOUNT, stage

from tests.package_index import build_wheel, serve_index

TAGS = target_tags("x86_64")


def _file(name: str, yanked: bool = False) -> IndexFile:
    return IndexFile(name, f"https://index.example/files/{name}", "ab" * 32, yanked)


def test_target_tags_are_the_launchers_interpreter_on_linux_most_specific_first() -> None:
    assert Tag("cp311", "cp311", "manylinux_2_17_x86_64") in TAGS
    assert Tag("cp311", "abi3", "manylinux2014_x86_64") in TAGS
    assert Tag("py3", "none", "any") in TAGS
    assert TAGS.index(Tag("cp311", "cp311", "manylinux_2_36_x86_64")) < TAGS.index(Tag("py3", "none", "any"))
    for foreign in (
        Tag("cp312", "cp312", "manylinux_2_17_x86_64"),
        Tag("cp311", "cp311", "manylinux_2_39_x86_64"),  # newer glibc than the image's
        Tag("cp311", "cp311", "manylinux_2_17_aarch64"),
        Tag("cp311", "cp311", "win_amd64"),
    ):
        assert foreign not in TAGS


def test_choose_takes_the_newest_admitted_version_with_a_compatible_wheel() -> None:
    files = [
        _file("numpy-2.3.4-cp311-cp311-manylinux_2_17_x86_64.whl"),
        _file("numpy-2.3.5-cp311-cp311-manylinux_2_17_x86_64.whl"),
        _file("numpy-2.4.0-cp312-cp312-manylinux_2_17_x86_64.whl"),  # other interpreter
        _file("numpy-2.4.1-cp311-cp311-macosx_14_0_arm64.whl"),  # other platform
        _file("numpy-2.5.0.tar.gz"),  # an sdist: never
        _file("numpy-2.6.0-cp311-cp311-manylinux_2_17_x86_64.whl", yanked=True),
        _file("numpyx-9.0-py3-none-any.whl"),  # another project
    ]
    assert (
        choose(Requirement("numpy"), files, TAGS).filename
        == "numpy-2.3.5-cp311-cp311-manylinux_2_17_x86_64.whl"
    )
    chosen = choose(Requirement("numpy<2.3.5"), files, TAGS)
    assert chosen.filename == "numpy-2.3.4-cp311-cp311-manylinux_2_17_x86_64.whl"


def test_choose_prefers_the_most_specific_tag_of_one_version() -> None:
    files = [_file("tool-1.0-py3-none-any.whl"), _file("tool-1.0-cp311-cp311-manylinux_2_28_x86_64.whl")]
    assert choose(Requirement("tool==1.0"), files, TAGS).filename.endswith("manylinux_2_28_x86_64.whl")


def test_no_compatible_wheel_is_a_clear_refusal() -> None:
    with pytest.raises(StagingError, match=r"no wheel of numpy>=3 for CPython 3\.11") as caught:
        choose(Requirement("numpy>=3"), [_file("numpy-2.3.4-cp311-cp311-manylinux_2_17_x86_64.whl")], TAGS)
    assert caught.value.transient is False


def test_index_pages_in_both_dialects() -> None:
    page = "https://mirror.example/simple/tool/"
    new, old = "tool-1.0-py3-none-any.whl", "tool-0.9-py3-none-any.whl"
    html = (
        f'<a href="../../files/{new}#sha256={"cd" * 32}">{new}</a>'
        f'<a href="https://cdn.example/{old}" data-yanked="">{old}</a>'
    ).encode()
    assert parse_index_page(html, "text/html", page) == [
        IndexFile(new, f"https://mirror.example/files/{new}", "cd" * 32),
        IndexFile(old, f"https://cdn.example/{old}", None, True),
    ]
    body = json.dumps({"files": [{"filename": new, "url": "/f/t.whl", "hashes": {"sha256": "ef"}}]}).encode()
    assert parse_index_page(body, "application/vnd.pypi.simple.v1+json", page) == [
        IndexFile(new, "https://mirror.example/f/t.whl", "ef")
    ]


@pytest.mark.parametrize(
    "text", ["tool @ https://x.example/t.whl", "tool; python_version<'3'", "tool[extra]", "-e ."]
)
def test_requirements_the_launcher_would_refuse_are_refused_before_any_download(
    text: str, tmp_path: Path
) -> None:
    with serve_index("127.0.0.1", {}) as index:
        with pytest.raises(StagingError) as caught:
            stage(index.url, [text], tmp_path / "w", arch="x86_64", max_bytes=1 << 20, timeout=5)
        assert caught.value.transient is False
        assert not [p for p in index.served if p.startswith("/files/")]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("speaks_json", [True, False], ids=["pep691", "pep503"])
def test_stage_writes_the_checked_wheels_read_only(tmp_path: Path, speaks_json: bool) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    old = build_wheel(wheels, "ptprobe", "1.0", "VALUE = 1\n")
    new = build_wheel(wheels, "ptprobe", "1.1", "VALUE = 2\n")
    dest = tmp_path / "store" / "wheels" / "ns" / "job"
    with serve_index("127.0.0.1", {"ptprobe": [old, new]}) as index:
        index.speaks_json = speaks_json
        pins = stage(index.url, ["ptprobe"], dest, arch="x86_64", max_bytes=1 << 20, timeout=5)
    digest = hashlib.sha256(new.read_bytes()).hexdigest()
    assert pins == [PackagePin("ptprobe", "1.1", digest)]
    assert sorted(p.name for p in dest.iterdir()) == sorted([new.name, "requirements.lock"])
    assert (dest / "requirements.lock").read_text() == f"ptprobe==1.1 --hash=sha256:{digest}\n"
    staged = dest / new.name
    assert hashlib.sha256(staged.read_bytes()).digest() == hashlib.sha256(new.read_bytes()).digest()
    assert stat.S_IMODE(staged.stat().st_mode) == 0o444
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert [p.name for p in dest.parent.iterdir()] == ["job"]  # no staging leftovers


def test_a_finished_directory_is_reused_without_asking_the_index(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, "ptprobe", "1.0", "")
    dest = tmp_path / "dest"
    with serve_index("127.0.0.1", {"ptprobe": [wheel]}) as index:
        pins = stage(index.url, ["ptprobe"], dest, arch="x86_64", max_bytes=1 << 20, timeout=5)
        asked = sum(index.served.values())
        assert stage(index.url, ["ptprobe"], dest, arch="x86_64", max_bytes=1 << 20, timeout=5) == pins
        assert sum(index.served.values()) == asked


def test_a_wheel_whose_hash_does_not_match_leaves_nothing(tmp_path: Path) -> None:
    good = build_wheel(tmp_path, "alpha", "1.0", "")
    tampered = build_wheel(tmp_path, "beta", "1.0", "")
    dest = tmp_path / "store" / "dest"
    with serve_index("127.0.0.1", {"alpha": [good], "beta": [tampered]}) as index:
        index.lie_about.add(tampered.name)
        with pytest.raises(StagingError, match="sha256 does not match") as caught:
            stage(index.url, ["alpha", "beta"], dest, arch="x86_64", max_bytes=1 << 20, timeout=5)
    assert caught.value.transient is False
    assert list(dest.parent.iterdir()) == []  # not even alpha: the directory is whole or absent


def test_too_many_bytes_of_wheels_are_refused(tmp_path: Path) -> None:
    big = build_wheel(tmp_path, "big", "1.0", "X = '" + "x" * 50_000 + "'\n")
    with serve_index("127.0.0.1", {"big": [big]}) as index, pytest.raises(StagingError, match="larger than"):
        stage(index.url, ["big"], tmp_path / "dest", arch="x86_64", max_bytes=10_000, timeout=5)
    assert not (tmp_path / "dest").exists()


def test_missing_project_is_final_and_an_unreachable_index_is_transient(tmp_path: Path) -> None:
    with serve_index("127.0.0.1", {}) as index:
        with pytest.raises(StagingError, match="HTTP 404") as missing:
            stage(index.url, ["nosuch"], tmp_path / "a", arch="x86_64", max_bytes=1 << 20, timeout=5)
        url = index.url
    assert missing.value.transient is False
    with pytest.raises(StagingError, match="unreachable") as down:
        stage(url, ["nosuch"], tmp_path / "b", arch="x86_64", max_bytes=1 << 20, timeout=5)
    assert down.value.transient is True


CONFIG = PodsConfig(
    image="launcher:test",
    flavors={"cpu-basic": Flavor("1", "2Gi", 167)},
    store_volume={"hostPath": {"path": "/var/lib/store", "type": "Directory"}},
    store_path="/unused",
)


def _request(packages: list[str]) -> JobRequest:
    spec: dict[str, Any] = {"version": 1, "role": "agent", "script": "print(1)", "packages": packages}
    return JobRequest("aj-key-1", "team-a", "ep1", "job1", "cpu-basic", 600, spec)


def test_a_pod_with_packages_mounts_its_staged_wheels_read_only_and_asks_no_index() -> None:
    body = pod_body(CONFIG, _request(["ptprobe==1.0"]))
    container = body["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PIP_NO_INDEX"] == "1" and env["PIP_FIND_LINKS"] == WHEELS_MOUNT
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == WHEELS_MOUNT]
    assert mount == {
        "name": STORE_RO_VOLUME,
        "mountPath": WHEELS_MOUNT,
        "subPath": wheels_subpath(body["metadata"]["namespace"], "aj-key-1"),
        "readOnly": True,
    }


def test_a_pod_without_packages_has_no_wheels_and_no_pip_settings() -> None:
    container = pod_body(CONFIG, _request([]))["spec"]["containers"][0]
    assert not [e for e in container["env"] if e["name"].startswith("PIP_")]
    assert not [m for m in container["volumeMounts"] if m["mountPath"] == WHEELS_MOUNT]


async def test_packages_without_a_configured_index_are_refused_before_any_api_call() -> None:
    backend = PodsBackend(CONFIG, client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    with pytest.raises(BackendError, match="no package index") as caught:
        await backend.submit(_request(["ptprobe"]))
    assert caught.value.transient is False
    assert backend.stats.calls == {}


def test_a_store_the_operator_cannot_write_is_a_clear_final_refusal(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "wheels").write_text("not a directory")
    with pytest.raises(StagingError, match="cannot stage wheels on the artifact store") as caught:
        stage("http://127.0.0.1:9/simple/", ["ptprobe"], store / "wheels" / "ns" / "job",
              arch="x86_64", max_bytes=1 << 20, timeout=5)  # fmt: skip
    assert caught.value.transient is False


@pytest.mark.parametrize("url", ["file:///etc/hostname", "ftp://127.0.0.1/x.whl"])
def test_an_index_pointing_off_http_is_refused(tmp_path: Path, url: str) -> None:
    """A hostile mirror cannot make the operator copy its own files into a job's wheels."""
    wheel = build_wheel(tmp_path, "ptprobe", "1.0", "")
    with serve_index("127.0.0.1", {"ptprobe": [wheel]}) as index:
        index.urls[wheel.name] = url
        with pytest.raises(StagingError, match="not an http") as caught:
            stage(index.url, ["ptprobe"], tmp_path / "dest", arch="x86_64", max_bytes=1 << 20, timeout=5)
    assert caught.value.transient is False and not (tmp_path / "dest").exists()


# --- dependencies ----------------------------------------------------------------------------------


def _index(tmp_path: Path, *wheels: tuple[str, str, list[str]]) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for name, version, requires in wheels:
        found.setdefault(name, []).append(build_wheel(tmp_path, name, version, "", requires=requires))
    return found


def _stage(index_url: str, requirements: list[str], dest: Path, provided: dict[str, str]) -> list[PackagePin]:
    return stage(
        index_url, requirements, dest, arch="x86_64", max_bytes=1 << 20, timeout=5, provided=provided
    )


EXTRA_ONLY = "ptextra; extra == 'x'"


def test_a_requirement_brings_its_dependencies_and_the_image_keeps_its_own(tmp_path: Path) -> None:
    wheels = _index(
        tmp_path,
        ("ptprobe", "1.0", ["ptdep>=2", "torch>=2.0", "ptwin; sys_platform == 'win32'", EXTRA_ONLY]),
        ("ptdep", "1.5", []),
        ("ptdep", "2.1", ["ptleaf==0.3", "ptprobe"]),  # a cycle back to the first
        ("ptleaf", "0.3", []),
        ("ptleaf", "0.4", []),
        ("ptwin", "1.0", []),
        ("ptextra", "1.0", []),
    )
    dest = tmp_path / "dest"
    with serve_index("127.0.0.1", wheels) as index:
        pins = _stage(index.url, ["ptprobe"], dest, provided={"torch": "2.15.0"})
    assert [(p.name, p.version) for p in pins] == [("ptprobe", "1.0"), ("ptdep", "2.1"), ("ptleaf", "0.3")]
    for pin in pins:  # each pinned with the sha256 of the wheel staged
        (wheel,) = [w for w in wheels[pin.name] if f"-{pin.version}-" in w.name]
        assert pin.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
        lock = (dest / "requirements.lock").read_text()
        assert f"{pin.name}=={pin.version} --hash=sha256:{pin.sha256}" in lock
    # torch, which the image holds, the win32-only and the extra's dependency were never asked for.
    assert not [p for p in index.served if "torch" in p or "ptwin" in p or "ptextra" in p]


@pytest.mark.parametrize(
    ("wheels", "provided", "message"),
    [
        ([("ptprobe", "1.0", ["torch<2"])], {"torch": "2.15.0"},
         "ptprobe 1.0 needs torch<2, but the job's image holds torch 2.15.0"),
        ([("ptprobe", "1.0", ["ptdep<2", "ptother"]), ("ptdep", "1.0", []),
          ("ptother", "1.0", ["ptdep>=2"])], {},
         "ptother 1.0 needs ptdep>=2, but an earlier requirement chose ptdep 1.0"),
        ([("ptprobe", "1.0", ["ptdep @ https://evil.example/ptdep.whl"])], {}, "is a URL"),
    ],
    ids=["replaces-the-image", "conflict", "url-dependency"],
)  # fmt: skip
def test_a_dependency_that_cannot_be_met_is_refused_naming_both_sides_and_stages_nothing(
    tmp_path: Path, wheels: list[tuple[str, str, list[str]]], provided: dict[str, str], message: str
) -> None:
    dest = tmp_path / "dest"
    with serve_index("127.0.0.1", _index(tmp_path, *wheels)) as index, pytest.raises(StagingError) as caught:
        _stage(index.url, ["ptprobe"], dest, provided)
    assert message in str(caught.value) and caught.value.transient is False
    assert not dest.exists()


def test_more_wheels_than_a_job_may_have_are_refused(tmp_path: Path) -> None:
    chain = [(f"ptchain{i}", "1.0", [f"ptchain{i + 1}"]) for i in range(80)]
    with serve_index("127.0.0.1", _index(tmp_path, *chain)) as index, pytest.raises(StagingError) as caught:
        _stage(index.url, ["ptchain0"], tmp_path / "dest", {})
    assert "more than 64 wheels" in str(caught.value)


def test_a_package_the_image_holds_is_said_so_in_the_lock_and_a_later_extra_brings_its_dependency(
    tmp_path: Path,
) -> None:
    wheels = _index(
        tmp_path,
        ("ptprobe", "1.0", ["ptdep", "ptuser"]),
        ("ptdep", "1.0", ["ptfast; extra == 'fast'"]),
        ("ptuser", "1.0", ["ptdep[fast]"]),  # asks ptdep, already chosen, for its extra
        ("ptfast", "1.0", []),
    )
    dest = tmp_path / "dest"
    with serve_index("127.0.0.1", wheels) as index:
        pins = _stage(index.url, ["ptprobe", "numpy>=2"], dest, provided={"numpy": "2.4.6"})
    assert [p.name for p in pins] == ["ptprobe", "ptdep", "ptuser", "ptfast"]
    assert "# numpy==2.4.6 (the image's)\n" in (dest / "requirements.lock").read_text()


def test_a_wheel_whose_metadata_would_unpack_past_its_bound_is_refused_unread(tmp_path: Path) -> None:
    bomb = tmp_path / "ptbomb-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("ptbomb-1.0.dist-info/METADATA", b"Name: ptbomb\n" + b" " * (8 << 20))
    with serve_index("127.0.0.1", {"ptbomb": [bomb]}) as index, pytest.raises(StagingError) as caught:
        _stage(index.url, ["ptbomb"], tmp_path / "dest", {})
    assert "METADATA unpacks to" in str(caught.value) and not (tmp_path / "dest").exists()


def test_markers_are_evaluated_for_the_launchers_interpreter_not_the_operators() -> None:
    from packaging.markers import default_environment
    from posttrain_operator.backends.wheel_choice import marker_environment

    environment = marker_environment("aarch64")
    assert set(default_environment()) <= set(environment)  # nothing left to the operator's own
    assert environment["python_full_version"].startswith("3.11.")
    assert environment["platform_machine"] == "aarch64"
