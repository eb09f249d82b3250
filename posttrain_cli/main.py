"""`posttrain` (also `kubectl posttrain`): episodes for people.

posttrain list [-A]                 episodes with their spend
posttrain watch [--until-done]      the same, live, one line per change
posttrain describe EPISODE          an episode and its ledger entries per job
posttrain logs AGENTJOB [--tail N]  a job's logs, through the operator's broker, as yourself
posttrain token EPISODE             a fresh agent token for an episode you may update
posttrain report [EPISODE]          an HTML report of one episode, or of the namespace
posttrain quota                     the namespace's BudgetQuota: limit, spent, left, per period
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from posttrain_operator.api import provenance
from posttrain_operator.api.rules import token_hash

from posttrain_cli.kube import CliError, Cluster
from posttrain_cli.views import (
    EPISODE_COLUMNS,
    describe,
    describe_quota,
    episode_row,
    provenance_line,
    provenance_lines,
    table,
)

DONE_PHASES = ("Completed", "Failed")
BROKER_ENV = "POSTTRAIN_BROKER_URL"


def _now() -> datetime:
    return datetime.now(UTC)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def cmd_list(cluster: Cluster, args: argparse.Namespace) -> None:
    episodes = cluster.episodes(all_namespaces=args.all_namespaces)
    now = _now()
    header: tuple[str, ...] = EPISODE_COLUMNS
    rows: list[tuple[str, ...]] = [episode_row(e, now) for e in episodes]
    if args.all_namespaces:
        header = ("NAMESPACE", *header)
        rows = [(e["metadata"]["namespace"], *row) for e, row in zip(episodes, rows, strict=True)]
    _out(table(header, rows) if rows else f"No episodes in namespace {cluster.namespace}.")


def cmd_watch(cluster: Cluster, args: argparse.Namespace) -> None:
    """One line per change of phase, steps or spend; with --until-done, exits once every episode
    seen has ended (the watch is re-opened when the server closes it)."""
    seen: dict[str, tuple[str, ...]] = {}
    _out("   ".join(EPISODE_COLUMNS))
    while True:
        for kind, ep in cluster.watch_episodes(timeout_seconds=args.timeout_seconds):
            name = ep["metadata"]["name"]
            if kind == "DELETED":
                seen.pop(name, None)
                _out(f"{name}   deleted")
                continue
            row = episode_row(ep, _now())
            if seen.get(name, ())[:-1] != row[:-1]:  # the age column alone is no change
                _out("   ".join(row))
            seen[name] = row
            if args.until_done and seen and all(r[1] in DONE_PHASES for r in seen.values()):
                return
        if not args.until_done:
            return


def cmd_describe(cluster: Cluster, args: argparse.Namespace) -> None:
    _out(describe(cluster.episode(args.episode), cluster.agentjobs(args.episode), _now()))


def cmd_quota(cluster: Cluster, args: argparse.Namespace) -> None:
    _out(describe_quota(cluster.quota(), cluster.namespace))


def cmd_provenance(cluster: Cluster, args: argparse.Namespace) -> None:
    records = cluster.provenance(args.episode)
    for line in provenance_lines(records):
        _out(line)
    summary = provenance.summarise(provenance.specs_of(records))
    steps = int((cluster.episode(args.episode).get("status") or {}).get("steps") or 0)
    sys.stderr.write(provenance_line(summary.wire(), steps) + "\n")
    if summary.chain != "intact":
        raise CliError(f"episode {args.episode}'s provenance is not whole: {summary.chain}")


def cmd_logs(cluster: Cluster, args: argparse.Namespace) -> None:
    broker = args.broker_url or os.environ.get(BROKER_ENV)
    if not broker:
        raise CliError(
            "where is the operator's broker? Pass --broker-url (or set POSTTRAIN_BROKER_URL), e.g. after "
            "`kubectl -n posttrain-system port-forward svc/posttrain-operator-broker 8081`: "
            "--broker-url http://127.0.0.1:8081"
        )
    token = cluster.bearer_token()
    if token is None:
        raise CliError(
            "the broker needs a bearer token, and this kubeconfig user has none (client certificate?)"
        )
    ns, name = urllib.parse.quote(cluster.namespace), urllib.parse.quote(args.job)
    url = f"{broker.rstrip('/')}/v1/namespaces/{ns}/agentjobs/{name}/logs?tail={args.tail}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode(errors="replace")
        raise CliError(f"the broker refused ({exc.code}): {detail}") from exc
    except urllib.error.URLError as exc:
        raise CliError(f"cannot reach the broker at {broker}: {exc.reason}") from exc
    for line in answer["lines"]:
        _out(line)
    if answer.get("truncated"):
        sys.stderr.write("(truncated)\n")


def cmd_token(cluster: Cluster, args: argparse.Namespace) -> None:
    """A fresh agent token: its hash replaces the episode's (so the old token stops working at once);
    the token itself is printed once and stored nowhere."""
    # Exactly what it does: read the Episode, then patch its status subresource.
    if not (cluster.may("get", "episodes") and cluster.may("patch", "episodes", subresource="status")):
        raise CliError(
            f"forbidden: you may not get episodes and patch episodes/status in namespace {cluster.namespace}"
        )
    episode = cluster.episode(args.episode)
    if (episode.get("status") or {}).get("phase") in DONE_PHASES:
        raise CliError(f"episode {args.episode} has ended; a token for it would be refused anyway")
    token = secrets.token_urlsafe(32)
    cluster.patch_episode_status(args.episode, {"status": {"agentTokenHash": token_hash(token)}})
    _out(token)


def cmd_report(cluster: Cluster, args: argparse.Namespace) -> None:
    from posttrain_cli.report import episode_report, namespace_report  # matplotlib: only for reports

    now = _now()
    if args.episode:
        records = cluster.provenance(args.episode)
        page, png = episode_report(
            cluster.episode(args.episode), cluster.agentjobs(args.episode), records, now
        )
        default = f"{args.episode}.html"
    else:
        page, png = namespace_report(cluster.namespace, cluster.episodes(), now)
        default = f"episodes-{cluster.namespace}.html"
    path = Path(args.output or default)
    path.write_text(page, encoding="utf-8")
    _out(f"wrote {path}")
    if args.png:
        Path(args.png).write_bytes(png)
        _out(f"wrote {args.png}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="posttrain", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    # As with kubectl, the cluster options go before or after the command (`list -n team-a`).
    common = argparse.ArgumentParser(add_help=False)
    for target, default in ((p, None), (common, argparse.SUPPRESS)):
        target.add_argument("--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG)")
        target.add_argument(
            "--context", default=default, help="kubeconfig context (default: the current one)"
        )
        target.add_argument("-n", "--namespace", default=default, help="namespace (default: the context's)")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    ls = command("list", "episodes with their spend")
    ls.add_argument("-A", "--all-namespaces", action="store_true")
    ls.set_defaults(run=cmd_list)
    w = command("watch", "episodes, live")
    w.add_argument("--until-done", action="store_true", help="exit once every episode seen has ended")
    w.add_argument("--timeout-seconds", type=int, default=300, help="re-open the watch after this long")
    w.set_defaults(run=cmd_watch)
    d = command("describe", "an episode and its ledger entries per job")
    d.add_argument("episode")
    d.set_defaults(run=cmd_describe)
    q = command("quota", "the namespace's BudgetQuota: its limit, what is spent and left, per period")
    q.set_defaults(run=cmd_quota)
    pv = command("provenance", "an episode's provenance records as JSON Lines, its chain checked")
    pv.add_argument("episode")
    pv.set_defaults(run=cmd_provenance)
    lg = command("logs", "an AgentJob's logs, through the operator's broker")
    lg.add_argument("job")
    lg.add_argument("--tail", type=int, default=100, help="last N lines (1..1000)")
    lg.add_argument("--broker-url", help=f"the operator's broker (default: ${BROKER_ENV})")
    lg.set_defaults(run=cmd_logs)
    t = command("token", "mint a fresh agent token for an episode (revokes the old one)")
    t.add_argument("episode")
    t.set_defaults(run=cmd_token)
    r = command("report", "an HTML report of EPISODE, or of the namespace's episodes")
    r.add_argument("episode", nargs="?")
    r.add_argument("-o", "--output", help="HTML file (default: EPISODE.html or episodes-NAMESPACE.html)")
    r.add_argument("--png", help="also write the figure as a PNG file")
    r.set_defaults(run=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cluster = Cluster.connect(args.kubeconfig, args.context, args.namespace)
        args.run(cluster, args)
    except CliError as exc:
        sys.stderr.write(f"posttrain: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
