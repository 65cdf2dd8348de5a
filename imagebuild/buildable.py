"""Whether a plan may build: what `build` and the whole job check before anything runs.
Its own module: the build command loads it without the whole job's later stages."""

from __future__ import annotations

from imagebuild.builder.builder import check_environment
from imagebuild.errors import UserError
from imagebuild.plan import Plan
from imagebuild.preflight.run import check_plan


def buildable(plan: Plan) -> Plan:
    """A plan that may build: a tag, the build's environment settings readable, pins
    locked and resolved, preflight clean; the same findings `check --tag` prints (lock
    agreement and unresolved pins: preflight/pins.py). The environment first: preflight
    may fetch the pinned vLLM, and bad input reaches no index."""
    if plan.tag is None:
        raise UserError("building needs a release tag", fix="pass --tag DATE-NAME")
    check_environment()
    check_plan(plan, building=True)
    return plan
