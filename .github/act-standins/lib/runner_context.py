"""What GitHub's runner hands a job that act (0.2.89, host mode) does not, derived the way
GitHub derives it, so a stand-in fails where the real action would:

- the OIDC request URL (ACTIONS_ID_TOKEN_REQUEST_URL) exists only in a job whose
  `permissions` grant `id-token: write` (job level, else workflow level);
- the GITHUB_TOKEN's other scopes (`attestations: write`, `artifact-metadata: write`,
  `contents: write`...) likewise;
- RUNNER_ENVIRONMENT is `github-hosted` for a job on GitHub's labels, `self-hosted` for
  one that asks for `self-hosted` (or for labels an expression picks: the plan's runners);
- the event's `repository` (visibility, owner type), as the webhook payload has it.

The workflow is the one act runs (IMAGEBUILD_REHEARSAL_WORKFLOW, set by the rehearsal),
the job GITHUB_JOB. Outside the rehearsal (GitHub itself) these stand-ins never run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

GITHUB_LABELS = ("ubuntu-", "windows-", "macos-")


def _workflow() -> dict[str, Any]:
    path = os.environ.get("IMAGEBUILD_REHEARSAL_WORKFLOW", "")
    if not path or not Path(path).is_file():
        return {}
    return dict(yaml.safe_load(Path(path).read_text()) or {})


def job() -> dict[str, Any]:
    return dict((_workflow().get("jobs") or {}).get(os.environ.get("GITHUB_JOB", ""), {}))


def permissions() -> dict[str, str]:
    """The job's GITHUB_TOKEN scopes: its own `permissions`, else the workflow's (a
    string such as write-all or read-all grants every scope that)."""
    wf = _workflow()
    perms = job().get("permissions", wf.get("permissions"))
    if isinstance(perms, str):
        level = perms.split("-")[0]
        return {k: level for k in ("contents", "packages", "id-token", "attestations",
                                   "artifact-metadata", "issues", "actions")}
    return {str(k): str(v) for k, v in (perms or {}).items()}


def can(scope: str, level: str = "write") -> bool:
    have = permissions().get(scope, "none")
    return have == level or (level == "read" and have == "write")


def id_token_url() -> str:
    """ACTIONS_ID_TOKEN_REQUEST_URL as the runner sets it: only with id-token: write."""
    return os.environ.get("ACTIONS_ID_TOKEN_REQUEST_URL") or (
        "http://127.0.0.1/rehearsal-oidc-stand-in" if can("id-token") else "")


def runner_environment() -> str:
    if os.environ.get("RUNNER_ENVIRONMENT"):
        return os.environ["RUNNER_ENVIRONMENT"]
    runs_on = job().get("runs-on")
    labels = runs_on if isinstance(runs_on, list) else [runs_on]
    hosted = all(isinstance(lb, str) and "${{" not in lb and lb.startswith(GITHUB_LABELS)
                 for lb in labels)
    return "github-hosted" if hosted and labels else "self-hosted"


def repository() -> dict[str, Any]:
    """The event payload's `repository` (visibility, private, owner.type)."""
    path = os.environ.get("GITHUB_EVENT_PATH", "")
    try:
        return dict(json.loads(Path(path).read_text()).get("repository") or {})
    except (OSError, ValueError):
        return {}


def workflow_ref() -> str:
    """GITHUB_WORKFLOW_REF: OWNER/REPO/.github/workflows/FILE@REF (the rehearsal sets it
    for the workflow it runs; act does not)."""
    return os.environ.get("GITHUB_WORKFLOW_REF", "")
