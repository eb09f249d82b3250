"""The nodes' loopback seccomp profile: Docker's conditional rules resolved for a container holding no
capability, on the node's architecture, as the OCI LinuxSeccomp the kubelet passes on, plus the one
`unshare` of the launcher."""

from __future__ import annotations

from typing import Any

import pytest

from devstack.kind.seccomp import UNSHARE_FLAGS, loopback_profile

DOCKER_PROFILE: dict[str, Any] = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 1,
    "archMap": [
        {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
        {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
    ],
    "syscalls": [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["ptrace"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "4.8"}},
        {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["amd64", "x32"]}},
        {"names": ["set_tls"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["arm", "arm64"]}},
        {
            "names": ["mount", "unshare", "setns"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"caps": ["CAP_SYS_ADMIN"]},
        },
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}],
            "excludes": {"caps": ["CAP_SYS_ADMIN"], "arches": ["s390", "s390x"]},
        },
        {
            "names": ["clone3"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 38,
            "excludes": {"caps": ["CAP_SYS_ADMIN"]},
        },
    ],
}


def _rules(profile: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [rule for rule in profile["syscalls"] if name in rule["names"]]


def test_the_profile_is_dockers_for_a_container_without_capabilities() -> None:
    profile = loopback_profile(DOCKER_PROFILE)
    # An OCI LinuxSeccomp: no conditions left for a reader that would ignore them.
    assert set(profile) == {"defaultAction", "defaultErrnoRet", "architectures", "syscalls"}
    assert (profile["defaultAction"], profile["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", 1)
    assert profile["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    for rule in profile["syscalls"]:
        assert not {"includes", "excludes", "comment"} & set(rule), rule
    assert _rules(profile, "read") and _rules(profile, "ptrace") and _rules(profile, "arch_prctl")
    assert not _rules(profile, "set_tls")  # another architecture's
    assert not _rules(profile, "mount") and not _rules(profile, "setns")  # CAP_SYS_ADMIN's
    (clone,) = _rules(profile, "clone")  # no namespace flags: kept, with its argument rule
    assert clone["args"] == [{"index": 0, "value": 2114060288, "op": "SCMP_CMP_MASKED_EQ"}]
    assert _rules(profile, "clone3") == [{"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]


def test_the_one_rule_added_is_unshare_of_exactly_a_user_and_a_network_namespace() -> None:
    profile = loopback_profile(DOCKER_PROFILE)
    assert _rules(profile, "unshare") == [
        {
            "names": ["unshare"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": UNSHARE_FLAGS, "op": "SCMP_CMP_EQ"}],
        }
    ]
    assert UNSHARE_FLAGS == 0x10000000 | 0x40000000
    no_docker_rules = loopback_profile({**DOCKER_PROFILE, "syscalls": []})
    assert no_docker_rules["syscalls"] == _rules(profile, "unshare")


def test_an_arm64_node_gets_its_own_rules_and_an_unknown_architecture_is_refused() -> None:
    profile = loopback_profile(DOCKER_PROFILE, "SCMP_ARCH_AARCH64")
    assert profile["architectures"] == ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    assert _rules(profile, "set_tls") and not _rules(profile, "arch_prctl")
    with pytest.raises(ValueError, match="no node architecture 'SCMP_ARCH_PPC64LE'"):
        loopback_profile(DOCKER_PROFILE, "SCMP_ARCH_PPC64LE")


def test_a_profile_read_wrong_fails_the_build_instead_of_reaching_a_node() -> None:
    unconditional = [{"names": ["setns", "read"], "action": "SCMP_ACT_ALLOW"}]
    with pytest.raises(ValueError, match=r"would allow \['setns'\] to every job"):
        loopback_profile({**DOCKER_PROFILE, "syscalls": unconditional})
