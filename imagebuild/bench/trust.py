"""When a level's figures cannot be trusted, and why: flags carried in the JSON and shown
in every table, and respected by the regression gate.

A streaming benchmark measures the server only while the client reads each chunk as it
arrives. When the client (or the server's API process) is starved of CPU, chunks pile up
and are read together: TTFT then holds the wait, inter-token gaps collapse to zero, and
the table shows latency the server never had (issue 15: client TTFT p50 140 ms against
the server's own 12.8 ms, ITL p50 0.007 ms). Each check compares what the client saw with
something it cannot fake: vLLM's own TTFT histogram, the physics of a decode step, the
client's own CPU accounting.
"""

from __future__ import annotations

from typing import Any

# HTTP, chat template, tokenization, SSE framing and the client's read: what separates
# the client's TTFT from vLLM's own histogram on a healthy run. Measured 2-11 ms on the
# cpu image on 2 cores for both this client and `vllm bench serve` (README); allowed:
# the larger of 15 ms and a quarter of the client's TTFT (queueing in the API server
# grows with load, and is real latency)
TTFT_SLACK_MS = 15.0
TTFT_SLACK_SHARE = 0.25
# No engine step takes under a fifth of a millisecond (vLLM's scheduling alone costs
# more), so events of one stream that close together were read together
COLLAPSED_GAP_MS = 0.2
COLLAPSED_SHARE = 0.25  # flagged when at least this share of the gaps collapsed
# The client is one event-loop thread: near a full core it queues its own reads
CLIENT_CPU_BOUND = 0.8  # CPU seconds per wall second
# ... and when it waits for a CPU this share of the time, reads are late by that much
CLIENT_STARVED = 0.10  # run-queue seconds per wall second
CLIENT_LAG_MS = 5.0  # p90 of how late a 5 ms timer fired in the client's event loop


def collapsed_share(gaps_ms: list[float]) -> float | None:
    if not gaps_ms:
        return None
    return sum(g < COLLAPSED_GAP_MS for g in gaps_ms) / len(gaps_ms)


def flags(level: dict[str, Any]) -> list[dict[str, str]]:
    """The reasons a level summary (results.summarize) cannot be trusted; [] when none."""
    out: list[dict[str, str]] = []

    def flag(code: str, reason: str) -> None:
        out.append({"code": code, "reason": reason})

    client = (level.get("ttft_ms") or {}).get("mean")
    server = level.get("server_ttft_mean_ms")
    if client is not None and server is not None:
        slack = max(TTFT_SLACK_MS, TTFT_SLACK_SHARE * client)
        if client - server > slack:
            flag("ttft-diverges",
                 f"client TTFT mean {client:.1f} ms vs the server's own {server:.1f} ms: "
                 f"{client - server:.0f} ms more than transport explains (<= {slack:.0f} ms)")
        elif server - client > TTFT_SLACK_MS:
            flag("ttft-below-server",
                 f"client TTFT mean {client:.1f} ms is below the server's own {server:.1f} "
                 "ms: the client timed the wrong event or the metrics window")
    share = level.get("itl_collapsed_share")
    if share is not None and share >= COLLAPSED_SHARE:
        flag("gaps-collapse",
             f"{share:.0%} of inter-token gaps are under {COLLAPSED_GAP_MS} ms: tokens were "
             "read in bursts, not as they were made")
    c = level.get("client") or {}
    if (cpu := c.get("cpu_share")) is not None and cpu >= CLIENT_CPU_BOUND:
        flag("client-cpu-bound",
             f"the load generator used {cpu:.0%} of a core: it cannot read chunks on time")
    wait = c.get("wait_share")
    lag = c.get("loop_lag_p90_ms")
    if (wait is not None and wait >= CLIENT_STARVED) or (lag is not None
                                                         and lag >= CLIENT_LAG_MS):
        flag("client-starved",
             f"the load generator waited for a CPU {0 if wait is None else wait:.0%} of the "
             f"time (event-loop lag p90 {0 if lag is None else lag:.1f} ms): chunks were read "
             "late; pin server and client apart (--server-cpus/--client-cpus)")
    return out


def untrusted(doc: dict[str, Any]) -> dict[int, list[dict[str, str]]]:
    """Flagged levels of a results document, by concurrency (older documents carry no
    flags and are taken as they are)."""
    return {int(lv["concurrency"]): list(lv["flags"]) for lv in doc.get("levels", [])
            if lv.get("flags")}


def summary(doc: dict[str, Any]) -> str:
    """One line per flagged level, '' when every level can be trusted."""
    return "\n".join(f"c={c}: " + "; ".join(f["reason"] for f in fl)
                     for c, fl in sorted(untrusted(doc).items()))
