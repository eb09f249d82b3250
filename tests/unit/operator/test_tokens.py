"""Rotated bearer tokens are reread: the hook follows the file, keeps the last token when the file
is briefly missing or empty, and finds a kubeconfig's tokenFile as kubectl does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import yaml
from posttrain_operator.api.tokens import RereadTokenFile, kubeconfig_token_file


def test_the_token_follows_the_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    hook, cfg = RereadTokenFile(token), SimpleNamespace(api_key={})
    hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer first"
    staged = tmp_path / "staged"
    staged.write_text("second-and-longer")
    staged.replace(token)  # as the kubelet swaps a projected token: a new file in its place
    hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer second-and-longer"
    token.write_text("")
    hook(cfg)
    token.unlink()
    hook(cfg)
    assert cfg.api_key["BearerToken"] == "Bearer second-and-longer"


def test_a_kubeconfig_token_file_is_found_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(yaml.safe_dump({
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"tokenFile": "sa.token"}}, {"name": "v", "user": {"token": "x"}}],
    }))  # fmt: skip
    assert kubeconfig_token_file(kubeconfig) == tmp_path / "sa.token"
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"]["user"] = "v"
    kubeconfig.write_text(yaml.safe_dump(config))
    assert kubeconfig_token_file(kubeconfig) is None
