"""The command line: cluster options before or after the command, as kubectl takes them."""

from __future__ import annotations

import pytest

from posttrain_cli.main import parser

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "team-a", "--context", "lab", "describe", "ep"],
        ["describe", "ep", "-n", "team-a", "--context", "lab"],
        ["--context", "lab", "describe", "-n", "team-a", "ep"],
    ],
    ids=["before", "after", "mixed"],
)
def test_cluster_options_go_before_or_after_the_command(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    assert (args.namespace, args.context, args.episode, args.kubeconfig) == ("team-a", "lab", "ep", None)


def test_a_command_is_required_and_tail_is_an_integer() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args([])
    with pytest.raises(SystemExit):
        parser().parse_args(["logs", "job", "--tail", "many"])
