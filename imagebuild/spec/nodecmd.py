"""The per-node commands of a multi-node cell (a profile's `parallel:` with nodes > 1).

Every node runs the same image; what differs is only the command and the interconnect
environment given at run time (docs/multi-node.md):

- backend `mp` (vLLM's multiprocessing executor across nodes, as vllm-project/recipes#414
  runs it): every node runs the cell's serve command plus `--nnodes N --node-rank R
  --master-addr $MASTER_ADDR --master-port P`; node 0 (the head) serves the API, the
  workers add `--headless`.
- backend `ray` (NVIDIA's DGX Spark playbook): the head starts a Ray head on the master
  port and then the serve command with `--distributed-executor-backend ray`; workers join
  the Ray head and block.

The head's address is never part of the image: the commands name `${MASTER_ADDR}`, which
the compose files take from the environment of `docker compose` (the launcher sets it from
its --hosts). `node_differences` is the check the launcher runs over the commands it is
about to start, rendered or hand-edited: a worker must agree with the head on every flag
but its own rank, and every node on the interconnect environment.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from imagebuild.spec.config import SOCKET_IFNAME_ENV, Parallel
from imagebuild.spec.matrix import Cell
from imagebuild.spec.servecmd import serve_command, with_listen

MASTER_ADDR_VAR = "MASTER_ADDR"
MASTER_ADDR = "${" + MASTER_ADDR_VAR + "}"  # filled in at run time, never in an image
# flags whose value is each node's own: the only ones a worker may differ in
PER_NODE_FLAGS = ("node-rank", "headless")
HEAD, WORKER = "head", "worker"


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs: its rank, the container's command and the environment it adds
    to the image's (the interconnect settings)."""

    rank: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    @property
    def role(self) -> str:
        return HEAD if self.rank == 0 else WORKER

    @property
    def name(self) -> str:
        """head, worker1, worker2...: the suffix of its compose file."""
        return HEAD if self.rank == 0 else f"{WORKER}{self.rank}"

    def shell(self) -> str:
        """The command as a shell line (release notes, plan): `$MASTER_ADDR` expands."""
        return " ".join(a if a == MASTER_ADDR else shlex.quote(a) for a in self.argv)


def interconnect_env(cell: Cell) -> tuple[tuple[str, str], ...]:
    """NCCL/Gloo interface names and the target's NCCL/IB settings, sorted."""
    ic = cell.target.interconnect
    if ic is None:
        return ()
    env = dict(ic.env)
    if ic.interfaces:
        for name in SOCKET_IFNAME_ENV:
            env[name] = ",".join(ic.interfaces)
    return tuple(sorted(env.items()))


def multi_node(cell: Cell) -> Parallel | None:
    """The cell's layout when it spans several nodes, else None."""
    par = cell.profile.parallel
    return par if par is not None and par.multi_node else None


def node_commands(cell: Cell) -> tuple[NodeCommand, ...]:
    """One command per node, head first; empty for a single-node cell."""
    par = multi_node(cell)
    if par is None:
        return ()
    cmd = serve_command(cell)
    base = list(cmd.argv)
    env = interconnect_env(cell)
    if par.backend == "ray":  # the serve command inside a shell line: it says where it listens
        serve = shlex.join(with_listen(base, cmd.port))
        head = ("sh", "-c", f'ray start --head --port={par.master_port} '
                f'--node-ip-address="$MASTER_ADDR" && exec {serve}')
        worker = ("sh", "-c", f'exec ray start --address="$MASTER_ADDR:{par.master_port}" '
                  "--block")
        return tuple(NodeCommand(rank, head if rank == 0 else worker, env)
                     for rank in range(par.nodes))
    out = []
    for rank in range(par.nodes):
        argv = [*base, "--nnodes", str(par.nodes), "--node-rank", str(rank),
                "--master-addr", MASTER_ADDR, "--master-port", str(par.master_port)]
        if rank:
            argv.append("--headless")
        out.append(NodeCommand(rank, tuple(argv), env))
    return tuple(out)


def flags_of(argv: Sequence[str]) -> dict[str, str | bool]:
    """`--name value` / `--name=value` / bare `--name` pairs of a serve argv."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[name] = argv[i + 1]
                i += 1
            else:
                out[name] = True
        i += 1
    return out


def _positional(argv: Sequence[str]) -> list[str]:
    return [a for a in argv[:next((i for i, a in enumerate(argv) if a.startswith("--")),
                                  len(argv))]]


def node_differences(nodes: Sequence[NodeCommand]) -> list[str]:
    """How each worker disagrees with the head, one sentence per difference; empty when
    they agree. For `mp` every serve flag but the node's own rank must match, for `ray`
    (workers run no serve command) the Ray head's port; the environment always."""
    if not nodes:
        return []
    head, problems = nodes[0], []
    ranks = sorted(n.rank for n in nodes)
    if ranks != list(range(len(nodes))):
        problems.append(f"node ranks are {ranks}, not 0..{len(nodes) - 1} once each")
    is_ray = head.argv[:2] == ("sh", "-c")
    head_flags = flags_of(head.argv)
    for node in nodes[1:]:
        who = f"{node.name} (node-rank {node.rank})"
        if is_ray:
            if node.argv[:2] != ("sh", "-c") or "ray start --address=" not in " ".join(
                    node.argv):
                problems.append(f"{who} does not join the head's Ray cluster")
        else:
            flags = flags_of(node.argv)
            if _positional(node.argv) != _positional(head.argv):
                problems.append(f"{who} runs {' '.join(_positional(node.argv))!r}, the head "
                                f"{' '.join(_positional(head.argv))!r}")
            for key in sorted(set(head_flags) | set(flags)):
                if key in PER_NODE_FLAGS:
                    continue
                if head_flags.get(key) != flags.get(key):
                    problems.append(f"{who} has --{key} {_shown(flags.get(key))}, the head "
                                    f"{_shown(head_flags.get(key))}")
            if str(flags.get("node-rank")) != str(node.rank):
                problems.append(f"{who} passes --node-rank {_shown(flags.get('node-rank'))}")
            if flags.get("headless") is not True:
                problems.append(f"{who} is not --headless (only the head serves the API)")
        head_env, env = dict(head.env), dict(node.env)
        for key in sorted(set(head_env) | set(env)):
            if head_env.get(key) != env.get(key):
                problems.append(f"{who} has {key}={_shown(env.get(key))}, the head "
                                f"{key}={_shown(head_env.get(key))}")
    if not is_ray and head_flags.get("headless"):
        problems.append("the head (node-rank 0) is --headless: nothing would serve the API")
    return problems


def _shown(value: str | bool | None) -> str:
    if value is None:
        return "(not set)"
    return "(bare flag)" if value is True else repr(value)
