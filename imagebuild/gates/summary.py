"""The gates' compact summary: what the release record carries (records.A_GATES), the
table reads and publish checks. One shape, exactly:
{"lossless": {"status", "reason", "requests", "compared_tokens", "ties", "tie_rate",
              "conditions": {name: {"status", "reason"}}},
 "long_generation": {"status", "reason", "tokens"}}
where the numbers are the fresh requests' and `conditions` holds each condition of the
lossless gate (gates/conditions.py), fresh included, in the order they ran."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from imagebuild.errors import OperationFailed
from imagebuild.gates import PASSING

REASON_CHARS = 600  # the record is an annotation (64 KiB cap); reasons stay readable
CONDITION_REASON_CHARS = 300


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    loss, lg = doc["lossless"], doc["long_generation"]
    return {
        "lossless": {"status": loss["status"], "reason": loss["reason"][:REASON_CHARS],
                     "requests": int(loss.get("requests", 0)),
                     "compared_tokens": int(loss.get("compared_tokens", 0)),
                     "ties": int(loss.get("ties", 0)),
                     "tie_rate": float(loss.get("tie_rate", 0.0)),
                     "conditions": {name: {"status": c["status"],
                                           "reason": c["reason"][:CONDITION_REASON_CHARS]}
                                    for name, c in (loss.get("conditions") or {}).items()}},
        "long_generation": {"status": lg["status"], "reason": lg["reason"][:REASON_CHARS],
                            "tokens": int(lg.get("tokens", 0))},
    }


def passed(s: dict[str, Any]) -> bool:
    return all(s.get(k, {}).get("status") in PASSING for k in ("lossless", "long_generation"))


def failures(s: dict[str, Any]) -> list[str]:
    """One line per gate that did not pass: `lossless untrusted: reason`."""
    return [f"{k} {v.get('status')}: {v.get('reason')}" for k, v in s.items()
            if v.get("status") not in PASSING]


def load_summary(path: Path, image_id: str | None = None) -> dict[str, Any]:
    """The summary of gates.json at `path`, for exactly `image_id` when given; refuses a
    missing, unreadable or other image's file (publish's gate)."""
    try:
        doc = json.loads(Path(path).read_text())
        s = doc["summary"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OperationFailed(f"no readable release-gates result {path} ({exc})",
                              fix="run the gates first (`build.py gates --tag T`)") from None
    if image_id is not None and doc.get("image_id") != image_id:
        raise OperationFailed(
            f"the gates ran on image {doc.get('image_id')}, but the image to publish is "
            f"{image_id}: refusing to publish an image the gates did not test",
            fix="run `build.py gates --tag T` on this image")
    return summary(doc) if isinstance(s, dict) else s
