"""Smoke of a multi-node cell: its workers first, then its head through the standard
smoke (runner.py and the suite, unchanged), then what only several nodes can get wrong.

Every node runs the same image from its own compose file (render's per-node files, head
first), started and watched by serving/nodes.py as the gates and the bench run them. On
top of the suite's checks, run through the head as for any cell:
- every_rank_joined: each node's log names the ranks it holds (vLLM's line "rank R in
  world size W is assigned as ... TP rank T") and together they are 0..W-1 once each,
  with W the cell's tensor-parallel size and each node holding its share.
- no_node_lost: a worker container that stops while the head boots or is checked is a lost
  node. vLLM's head does not notice a lost rank by itself until a collective times out, so
  the head is stopped at once; the verdict then fails with the node, its exit code and
  the exceptions its log raised, seconds after the loss (docs/multi-node-cpu.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from imagebuild.serving.nodes import NodeRun, lost_message

RANK_LINE = re.compile(r"\brank (\d+) in world size (\d+) is assigned as\b.*?\bTP rank (\d+)")
NODE_CHECKS = ("every_rank_joined", "no_node_lost")


class NodeJudge(Protocol):
    """What runner.smoke_image asks of a multi-node run."""

    def stop_watching(self) -> None: ...

    def judge(self, verdict: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        ...


def ranks_check(logs: Mapping[str, list[str]], world: int, per_node: int
                ) -> dict[str, Any]:
    """every_rank_joined from each node's log lines (name -> lines, head first)."""
    held: dict[str, list[int]] = {}
    sizes: set[int] = set()
    for name, lines in logs.items():
        for line in lines:
            m = RANK_LINE.search(line)
            if m:
                held.setdefault(name, []).append(int(m.group(3)))
                sizes.add(int(m.group(2)))
    problems = []
    if sizes and sizes != {world}:
        problems.append(f"vLLM reports world size {sorted(sizes)}, the cell's tensor "
                        f"parallel size is {world}")
    ranks = sorted(r for rs in held.values() for r in rs)
    if ranks != list(range(world)):
        problems.append(f"the nodes hold TP ranks {ranks}, not 0..{world - 1} once each")
    for name in logs:
        n = len(held.get(name, []))
        if n != per_node:
            problems.append(f"{name} holds {n} rank(s), not {per_node}")
    shown = "; ".join(f"{name}: TP rank {', '.join(map(str, held.get(name, []))) or 'none'}"
                      for name in logs)
    return {"name": "every_rank_joined", "outcome": "failed" if problems else "passed",
            "seconds": 0.0, "message": "; ".join(problems) + (f" ({shown})" if problems
                                                               else ""),
            "measured": {"world_size": float(world), "ranks": shown}}


class JudgedNodes(NodeRun):
    """A multi-node smoke's nodes: run as serving/nodes.py runs them, then judged."""

    def judge(self, verdict: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The verdict with the node checks (and why a lost node failed it)."""
        world = len(self.files) * self.ranks_per_node
        head_log = Path(verdict["files"]["log"])
        logs = {self.files[0].name: (head_log.read_text(errors="replace").splitlines()
                                     if head_log.exists() else [])}
        for w in self.workers:
            logs[w.file.name] = (w.log.read_text(errors="replace").splitlines()
                                 if w.log.exists() else [])
        ready = verdict["boot"].get("kind") == "ready"
        ranks = ranks_check(logs, world, self.ranks_per_node)
        if not ready and ranks["outcome"] == "passed":
            ranks = {**ranks, "outcome": "failed", "message": "the head never served"}
        lost = self.lost
        node_lost = {"name": "no_node_lost", "outcome": "failed" if lost else "passed",
                     "seconds": 0.0, "message": lost_message(lost) if lost else ""}
        extra = [ranks, node_lost]
        v = dict(verdict)
        v["checks"] = {**v["checks"], **{c["name"]: {"passed": c["outcome"] == "passed", **c}
                                         for c in extra}}
        v["nodes"] = [{"name": f.name, "rank": f.rank} for f in self.files]
        for entry, w in zip(v["nodes"][1:], self.workers, strict=False):
            entry.update(container=w.container, log=str(w.log), host=w.host or "local")
        if lost:
            v.update(passed=False, outcome="node lost", message=node_lost["message"])
            v["timings"] = {**v["timings"],
                            "lost_to_verdict_s": round(time.time() - lost.at, 2)}
        elif v["passed"] and ranks["outcome"] != "passed":
            v.update(passed=False, outcome="checks failed",
                     message=f"1 check(s) failed: every_rank_joined: {ranks['message']}")
        return v, extra
