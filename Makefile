# Thin entry points for the workflows (.github/workflows/*): each target calls build.py or
# one tool, so the logic stays in tested Python. Inputs come from the environment
# (RELEASE_TAG, ROLLBACK_TO, ROLLBACK_IMAGE), never spliced into YAML.
PY ?= .venv/bin/python
TAG ?= 2026-06-18-dflashfix
PINS_DIR ?= build/pins
export PYTHONDONTWRITEBYTECODE = 1
SHELL := bash
.SHELLFLAGS := -euo pipefail -c

.PHONY: venv setup lint typecheck workflows checks unit test release-matrix runner-clean \
	release-notes github-release rollback pins-watch pin-issues

venv:  ## the pinned project venv only (no Docker, no vLLM): lint, unit, plan, notes
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q -r requirements-dev.txt

setup:  ## a whole machine: Docker engine, venvs, embedded registry (README)
	bash scripts/setup.sh

lint:
	.venv/bin/ruff check .

typecheck:
	.venv/bin/mypy imagebuild

workflows:
	bash scripts/lint-workflows.sh

checks:  ## generated files and the lock are current; preflight passes on both targets
	$(PY) build.py render --check
	$(PY) build.py lock --check
	$(PY) build.py check --tag $(TAG) --target gb10
	$(PY) build.py check --tag $(TAG) --target cpu

unit:
	$(PY) -m pytest -q tests/unit tests/render -m "not slow and not vllm"

test:
	$(PY) -m pytest

release-matrix:  ## `matrix=<plan --format github>` for $GITHUB_OUTPUT
	m=$$($(PY) build.py plan --tag "$$RELEASE_TAG" --target gb10 --format github) && \
	  printf 'matrix=%s\n' "$$m"

runner-clean:  ## smoke containers, dangling layers, images of releases older than the newest $$KEEP (default 3; latest, its rollback target and BuildKit cache mounts stay)
	docker ps -aq --filter label=io.imagebuild.smoke | xargs -r docker rm -f
	docker image prune --force
	$(PY) build.py runner-clean --keep "$${KEEP:-3}"

release-notes:  ## notes + one bench plot per image ($$ASSET_URL: where the release keeps them)
	mkdir -p build/release-assets
	$(PY) build.py notes --tag "$$RELEASE_TAG" --target gb10 --smoke-dir build \
	  --plot-dir build/release-assets --asset-url "$$ASSET_URL" > build/release-notes.md

github-release:  ## create the release, or refresh its notes and plots when re-run
	if gh release view "$$RELEASE_TAG" >/dev/null 2>&1; then \
	  gh release edit "$$RELEASE_TAG" --notes-file build/release-notes.md; \
	  find build/release-assets -name '*.png' -exec gh release upload --clobber "$$RELEASE_TAG" {} +; \
	else \
	  gh release create "$$RELEASE_TAG" --verify-tag --title "$$RELEASE_TAG" \
	    --notes-file build/release-notes.md $$(find build/release-assets -name '*.png'); \
	fi

rollback:
	$(PY) build.py rollback --to "$$ROLLBACK_TO" $${ROLLBACK_IMAGE:+--image "$$ROLLBACK_IMAGE"}

pins-watch:
	$(PY) build.py pins watch --format markdown --out $(PINS_DIR) \
	  | tee -a "$${GITHUB_STEP_SUMMARY:-/dev/null}"

pin-issues:  ## one open issue per moved pin, found by its exact title and updated in place
	gh label create pin-watch --force --color BFD4F2 \
	  --description "build.py pins watch: a pinned model or drafter moved upstream"
	for body in $(PINS_DIR)/*.md; do \
	  [ -e "$$body" ] || continue; \
	  title=$$(cat "$${body%.md}.title"); \
	  num=$$(gh issue list --label pin-watch --state open --limit 200 \
	    --json number,title --jq '.[] | [.number, .title] | @tsv' \
	    | awk -F '\t' -v t="$$title" '$$2 == t { print $$1; exit }'); \
	  if [ -n "$$num" ]; then gh issue edit "$$num" --body-file "$$body"; \
	  else gh issue create --title "$$title" --label pin-watch --body-file "$$body"; fi; \
	done
