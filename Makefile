# Thin entry points for the workflows (.github/workflows/*): each target calls build.py or
# one tool, so the logic stays in tested Python. Inputs come from the environment
# (RELEASE_TAG, RELEASE_TARGET, CELL, CELL_TARGET, ACCEPT, ACCEPT_REASON, ROLLBACK_TO,
# ROLLBACK_IMAGE), never spliced into YAML. Targets come from the plan, never from a name
# written here: RELEASE_TARGET is a target of matrix.yaml or `all` (the default).
PY ?= .venv/bin/python
TAG ?= 2026-06-18-dflashfix
PINS_DIR ?= build/pins
export PYTHONDONTWRITEBYTECODE = 1
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
# Targets whose stdout a workflow appends to $GITHUB_OUTPUT or its step summary: Make must
# not echo their recipe lines there (the runner refuses any line that is not name=value)
.SILENT: release-commit release-matrix pins-watch job-env resume-state run-changed attest-subject

.PHONY: venv venv-gpu venv-dev job-env resume-state resume-pull run-changed teardown rehearse-release setup setup-tests lint typecheck workflows checks unit test release-commit release-matrix \
	accept-check cell-build promote bootstrap-deps runner-clean release-notes github-release rollback \
	pins-watch pin-issues registry-login attest-subject attest-verify partners-check \
	runner-check job-clean release-badge pins-keepalive shared-venv

# Every job runs Python $(PYTHON_VERSION) (setup-python puts it first on PATH, on
# self-hosted runners too). A runner that keeps one venv across jobs (a self-hosted Spark,
# the act rehearsal) names it in IMAGEBUILD_VENV: a job links it only when it was made for
# exactly these requirements and this Python (its stamps, as `make shared-venv` writes
# them), and never installs into it (one job's pip would change every later job's tools);
# otherwise the job makes a venv of its own.
PYTHON_VERSION ?= 3.11
PYVER = "import sys; print('%d.%d' % sys.version_info[:2])"
venv:  ## what the release jobs run: the run-time requirements only (no linters, no CUDA tools)
	v="$${IMAGEBUILD_VENV:-}"; \
	if [ ! -e .venv ] && [ -n "$$v" ] && cmp -s requirements.txt "$$v/.runtime-requirements.txt" \
	    && [ "$$("$$v/bin/python" -c $(PYVER) 2>/dev/null)" = "$(PYTHON_VERSION)" ]; then \
	  ln -sfn "$$v" .venv; \
	elif [ -n "$$v" ] && [ ! -e .venv ]; then \
	  echo "venv: IMAGEBUILD_VENV=$$v was not made for these requirements and Python $(PYTHON_VERSION) (make shared-venv): this job makes its own" >&2; fi
	test -e .venv || python3 -m venv .venv
	got=$$($(PY) -c $(PYVER)); [ "$$got" = "$(PYTHON_VERSION)" ] || { \
	  echo "error: .venv runs Python $$got, the jobs run $(PYTHON_VERSION): put python$(PYTHON_VERSION) first on PATH (actions/setup-python does) and remove .venv" >&2; exit 2; }
	[ -L .venv ] || cmp -s requirements.txt .venv/.runtime-requirements.txt || { \
	  $(PY) -m pip install -q -r requirements.txt && cp requirements.txt .venv/.runtime-requirements.txt; }

venv-gpu: venv  ## jobs that build for a GPU target: cuobjdump for the GPU-code table on top
	if [ -L .venv ] && ! cmp -s requirements-gpu.txt .venv/.gpu-requirements.txt; then \
	  echo "venv-gpu: the shared venv has no GPU tools: this job makes its own" >&2; \
	  rm .venv && $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) venv IMAGEBUILD_VENV=; fi
	[ -L .venv ] || cmp -s requirements-gpu.txt .venv/.gpu-requirements.txt || { \
	  $(PY) -m pip install -q -r requirements-gpu.txt && cp requirements-gpu.txt .venv/.gpu-requirements.txt; }

shared-venv:  ## a runner's venv for every job (IMAGEBUILD_VENV=DIR; GPU=1 adds requirements-gpu.txt): made once, stamped, never changed by a job
	[ -n "$${IMAGEBUILD_VENV:-}" ] || { echo "error: shared-venv needs IMAGEBUILD_VENV=DIR (the runner's .env names the same)" >&2; exit 2; }
	[ ! -e "$$IMAGEBUILD_VENV" ] || { echo "error: $$IMAGEBUILD_VENV exists: a shared venv is never changed in place; make a new one and point IMAGEBUILD_VENV at it" >&2; exit 2; }
	python3 -m venv "$$IMAGEBUILD_VENV"
	"$$IMAGEBUILD_VENV/bin/python" -m pip install -q -r requirements.txt
	cp requirements.txt "$$IMAGEBUILD_VENV/.runtime-requirements.txt"
	[ -z "$${GPU:-}" ] || { "$$IMAGEBUILD_VENV/bin/python" -m pip install -q -r requirements-gpu.txt && \
	  cp requirements-gpu.txt "$$IMAGEBUILD_VENV/.gpu-requirements.txt"; }

venv-dev: venv  ## lint and test jobs: requirements-dev.txt on top (a shared venv without them: a venv of this job's own)
	if [ -L .venv ] && ! cmp -s requirements-dev.txt .venv/.dev-requirements.txt; then \
	  echo "venv-dev: the shared venv has no dev tools: this job makes its own" >&2; \
	  rm .venv && $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) venv IMAGEBUILD_VENV=; fi
	[ -L .venv ] || cmp -s requirements-dev.txt .venv/.dev-requirements.txt || { \
	  $(PY) -m pip install -q -r requirements-dev.txt && cp requirements-dev.txt .venv/.dev-requirements.txt; }

# A release job's environment, for $$GITHUB_ENV: the registry namespace
# (vars.IMAGEBUILD_NAMESPACE as set, a capital in it refused by build.py naming the
# variable; else the repository owner lowercased: GitHub owners may have capitals, registry
# paths may not), and a home of this job only under $$RUNNER_TEMP (which the runner empties
# at the end of each job; job-clean removes it too): IMAGEBUILD_JOB_HOME, with the job's
# Docker config at its .docker (DOCKER_CONFIG), where both the Docker CLI and @sigstore/oci
# (which reads $$HOME/.docker/config.json only) find the job's login. No `docker login` left
# in the runner user's ~/.docker lends its credentials, and none of this job's stays
# behind (the runner's CLI plugins and buildx builders stay: linked, not copied).
JOB_DIR = $${RUNNER_TEMP:-$${TMPDIR:-/tmp}}/imagebuild-job-$${GITHUB_RUN_ID:-local}-$${GITHUB_JOB:-job}
job-env:
	d="$(JOB_DIR)/home"; \
	rm -rf "$(JOB_DIR)" && mkdir -p "$$d/.docker" && chmod -R 700 "$(JOB_DIR)"; \
	for keep in cli-plugins buildx; do o="$${DOCKER_CONFIG:-$$HOME/.docker}/$$keep"; \
	  [ ! -e "$$o" ] || ln -s "$$o" "$$d/.docker/$$keep"; done; \
	printf 'IMAGEBUILD_NAMESPACE=%s\nIMAGEBUILD_JOB_HOME=%s\nDOCKER_CONFIG=%s\n' \
	  "$${NAMESPACE_VAR:-$${GITHUB_REPOSITORY_OWNER,,}}" "$$d" "$$d/.docker"

job-clean:  ## this job's home and Docker config (its registry login), when it ends (if: always())
	rm -rf "$(JOB_DIR)"

# What a self-hosted runner must have before a job spends hours there: the tools the
# steps call, Python $(PYTHON_VERSION) with venv and pip, a Docker Engine 23+ answering
runner-check:  ## the runner's tools (git, make, python3 venv, Docker 23+), before any build
	missing=; for tool in git make python3 docker; do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	[ -z "$$missing" ] || { echo "error: this runner lacks:$$missing (README, CI set-up checklist: Runners)" >&2; exit 2; }; \
	python3 -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "error: python3 on this runner has no venv/ensurepip (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 2; }; \
	got=$$(python3 -c $(PYVER)); [ "$$got" = "$(PYTHON_VERSION)" ] || { \
	  echo "error: python3 is $$got, the jobs run $(PYTHON_VERSION) (actions/setup-python puts it first on PATH)" >&2; exit 2; }; \
	server=$$(docker version --format '{{.Server.Version}}' 2>/dev/null) || { \
	  echo "error: the Docker engine does not answer on this runner (docker version)" >&2; exit 2; }; \
	[ "$${server%%.*}" -ge 23 ] 2>/dev/null || [ "$${IMAGEBUILD_RUNNER_DOCKER:-}" = "$$server" ] || { \
	  echo "error: Docker Engine $$server: the release needs 23+ (BuildKit by default)" >&2; exit 2; }; \
	echo "runner-check: git, make, Python $$got with venv, Docker $$server"

setup:  ## a whole machine for the main job: Docker engine, run-time venv, embedded registry (README)
	bash scripts/setup.sh

setup-tests:  ## setup, then what only the tests need: test tools, the vLLM oracle venv, gcc, redis-server
	bash scripts/setup-tests.sh

lint:
	.venv/bin/ruff check .

typecheck:
	.venv/bin/mypy imagebuild tools

workflows:
	bash scripts/lint-workflows.sh

checks:  ## generated files and the lock are current; preflight passes on every target (unresolved pins warn), and as a release of the cells this machine builds (they are errors there)
	$(PY) build.py render --check
	$(PY) build.py lock --check
	$(PY) build.py check --target all
	$(PY) build.py check --tag $(TAG)  # the target that fits this host

unit:
	$(PY) -m pytest -q tests/unit tests/render -m "not slow and not vllm"

test:
	$(PY) -m pytest

# main's history is in the checkout: the release workflow checks out with fetch-depth 0
release-commit:  ## `commit=SHA` of refs/tags/$$RELEASE_TAG, refused unless it is on main
	c=$$(git rev-parse --verify --quiet "refs/tags/$$RELEASE_TAG^{commit}") || \
	  { echo "release-commit: no tag $$RELEASE_TAG in this checkout" >&2; exit 1; }; \
	git rev-parse --verify --quiet refs/remotes/origin/main >/dev/null || \
	  { echo "release-commit: origin/main was not fetched (checkout with fetch-depth: 0)" >&2; exit 1; }; \
	git merge-base --is-ancestor "$$c" refs/remotes/origin/main || \
	  { echo "release-commit: tag $$RELEASE_TAG ($$c) is not on main: releases are built from main's history only" >&2; exit 1; }; \
	[ "$$(git rev-parse HEAD)" = "$$c" ] || \
	  { echo "release-commit: the checkout is not the commit of tag $$RELEASE_TAG" >&2; exit 1; }; \
	w=$${GITHUB_WORKFLOW_SHA:-$$c}; \
	git diff --quiet "$$w" "$$c" -- .github/workflows/release.yml || \
	  { echo "release-commit: this run's release.yml (of $$w) is not the one of tag $$RELEASE_TAG ($$c): a dispatch runs main's workflow against the tag's Makefile; push a new tag made on main instead" >&2; exit 1; }; \
	printf 'commit=%s\n' "$$c"

release-matrix:  ## `cells=` (one entry per cell) and `targets=` (one per target: its engine job) of the plan, for $$GITHUB_OUTPUT
	cells=$$($(PY) build.py plan --tag "$$RELEASE_TAG" --target "$${RELEASE_TARGET:-all}" --format github) && \
	targets=$$($(PY) build.py plan --tag "$$RELEASE_TAG" --target "$${RELEASE_TARGET:-all}" --format targets) && \
	  printf 'cells=%s\ntargets=%s\n' "$$cells" "$$targets"

accept-check:  ## the gates named in $$ACCEPT exist and $$ACCEPT_REASON says why (before anything is built)
	$(PY) -m tools.accept_overrides >/dev/null

cell-build:  ## $$CELL's serve layers FROM the engine its target's engine job pushed (build/engines/$$CELL_TARGET.ref)
	ref=$$(cat "build/engines/$$CELL_TARGET.ref") && \
	$(PY) build.py build --tag "$$RELEASE_TAG" --target "$$CELL_TARGET" --image "$$CELL" \
	  --engine-image "$$ref"

promote:  ## move latest to the release ($$RELEASE_TAG of $$RELEASE_TARGET), passing the gates $$ACCEPT names with $$ACCEPT_REASON; then store its compatibility table (also when a gate refused it: the table says why)
	mkdir -p build
	$(PY) -m tools.accept_overrides > build/accept.args
	mapfile -t accept < build/accept.args; rc=0; \
	$(PY) build.py promote --forward-only --tag "$$RELEASE_TAG" --target "$${RELEASE_TARGET:-all}" "$${accept[@]}" || rc=$$?; \
	$(PY) build.py table --store --tag "$$RELEASE_TAG" --target "$${RELEASE_TARGET:-all}" > build/compat.md || rc=$$(( rc ? rc : $$? )); \
	exit $$rc

bootstrap-deps:  ## mmdebstrap where no bootstrapper is installed (a hosted runner building a bootstrapped base)
	command -v mmdebstrap >/dev/null || command -v debootstrap >/dev/null || { \
	  sudo apt-get update -qq && \
	  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap; }

# `cell` steps skip what the tag already holds: published=, tested=, benched=, done= of
# $$CELL (a cell job) or of every cell of $$ENGINE_TARGET (its engine job), read-only
# (a copy in build/resume-state.txt: the cell artifact's files then always share the root
# build/, so promote finds them where notes look, whichever of them this run made)
resume-state:
	mkdir -p build
	$(PY) build.py resume --tag "$$RELEASE_TAG" --target "$${CELL_TARGET:-$$ENGINE_TARGET}" \
	  $${CELL:+--image "$$CELL"} --verdict-dir build | tee build/resume-state.txt

# GitHub artifact attestations of a published cell, made by release.yml's sign job (a
# GitHub-hosted runner; stand-ins under act): what it signs is read back from the
# registry, the release's manifest digest and the SBOM publish stored with it.
# registry-login writes the login where the attestation push (@sigstore/oci) reads it:
# $$IMAGEBUILD_JOB_HOME/.docker/config.json, one `auths` entry for exactly this registry,
# written directly (no credential helper a `docker login` might choose, which that library
# cannot read), never the runner user's own ~/.docker.
registry-login:
	[ -n "$${IMAGEBUILD_JOB_HOME:-}" ] || { echo "error: registry-login needs IMAGEBUILD_JOB_HOME (make job-env first)" >&2; exit 2; }
	[ -n "$${IMAGEBUILD_REGISTRY_PASSWORD:-}" ] || { echo "error: no password for $$IMAGEBUILD_REGISTRY: set the secret IMAGEBUILD_REGISTRY_PASSWORD (only ghcr.io is sent the job's own token)" >&2; exit 2; }
	umask 077; mkdir -p "$$IMAGEBUILD_JOB_HOME/.docker"; \
	auth=$$(printf '%s:%s' "$$IMAGEBUILD_REGISTRY_USER" "$$IMAGEBUILD_REGISTRY_PASSWORD" | base64 -w0); \
	printf '{"auths": {"%s": {"auth": "%s"}}}\n' "$$IMAGEBUILD_REGISTRY" "$$auth" \
	  > "$$IMAGEBUILD_JOB_HOME/.docker/config.json"

attest-subject:  ## name=, digest=, sbom= of $$CELL's release as the registry holds it, for $$GITHUB_OUTPUT
	$(PY) -m imagebuild.release.attest_subject --tag "$$RELEASE_TAG" --target "$$CELL_TARGET" \
	  --image "$$CELL" --out build/supply-chain

# By the release tag, as users run it: the attestations must be of the digest the tag
# holds (a wrong subject digest fails here), recorded for this repository and signed by its
# release workflow on a GitHub-hosted runner (not merely by any workflow of the owner)
attest-verify:  ## both attestations of $$CELL's release verify for $$REPOSITORY's release workflow, as users run it
	f="build/supply-chain/$$CELL/subject.txt"; \
	ref="oci://$$(sed -n 's/^name=//p' "$$f"):$$(sed -n 's/^tag=//p' "$$f")"; \
	signer="$$REPOSITORY/.github/workflows/release.yml"; \
	gh attestation verify "$$ref" --repo "$$REPOSITORY" --signer-workflow "$$signer" \
	  --deny-self-hosted-runners; \
	gh attestation verify "$$ref" --repo "$$REPOSITORY" --signer-workflow "$$signer" \
	  --deny-self-hosted-runners --predicate-type https://cyclonedx.org/bom

# A resumed cell benches what its tag holds: the tested image, pulled by digest and checked
# against the release record (after runner-clean, which may remove older releases' images)
resume-pull:
	$(PY) build.py resume --tag "$$RELEASE_TAG" --target "$$CELL_TARGET" --image "$$CELL" --pull \
	  >/dev/null

# Smoke and bench containers that compose started from this checkout (its working_dir
# label lies under this workspace): this job's only, never another job's on a shared Spark.
# A container the engine was still creating when the job was cancelled lands a moment
# later: when the first sweep found any, a second one follows.
teardown:  ## this job's containers, after a failure or a cancel (if: always())
	sweep() { docker ps -a --filter label=com.docker.compose.project.working_dir \
	  --format '{{.ID}} {{.Label "com.docker.compose.project.working_dir"}}' \
	  | awk -v ws="$(CURDIR)/" 'index($$2 "/", ws) == 1 { print $$1 }'; }; \
	ids=$$(sweep); [ -z "$$ids" ] || { echo "$$ids" | xargs docker rm -f; sleep 2; \
	  sweep | xargs -r docker rm -f; }

# A cell over several machines runs on a runner labelled `pair` (nodes-N for more) that
# drives its partners' Docker engines over SSH; both settings live in the runner's own
# .env, never in the repository (docs/release-workflow.md)
partners-check:  ## each partner's Docker engine answers (IMAGEBUILD_PARTNERS), the head's address is set (IMAGEBUILD_MASTER_ADDR)
	[ -n "$${IMAGEBUILD_PARTNERS:-}" ] && [ -n "$${IMAGEBUILD_MASTER_ADDR:-}" ] || { \
	  echo "error: a multi-node cell needs a runner that names its partners: IMAGEBUILD_PARTNERS (ssh://user@host, one per worker node, comma-separated) and IMAGEBUILD_MASTER_ADDR (this runner's interconnect address) in the runner's .env; docs/release-workflow.md" >&2; exit 2; }
	for host in $$(tr ',' ' ' <<< "$$IMAGEBUILD_PARTNERS"); do \
	  docker --host "$$host" version --format "$$host: Docker {{.Server.Version}}"; done

runner-clean: teardown  ## this workspace's leftover containers, dangling layers, images of releases older than the newest $$KEEP (default 3; latest, its rollback target and BuildKit cache mounts stay)
	docker image prune --force
	$(PY) build.py runner-clean --keep "$${KEEP:-3}"

# changed=false only when the GitHub release exists and every cell of this run was done
# before it (its smoke verdict is the release record's, see `resume --verdict-dir`): the
# notes would say the same again, so a no-op re-run skips them
run-changed:
	changed=false; n=0; \
	gh release view "$$RELEASE_TAG" >/dev/null 2>&1 || changed=true; \
	for v in build/smoke/*/*/*/verdict.json; do [ -e "$$v" ] || continue; n=$$((n + 1)); \
	  grep -q '"source": "release record"' "$$v" || changed=true; done; \
	[ "$$n" -gt 0 ] || changed=true; \
	printf 'changed=%s\n' "$$changed"

release-notes:  ## notes of the whole release (every target: a dispatch for one target never drops the others' part) + their assets ($$ASSET_URL: where the release keeps them)
	mkdir -p build/release-assets
	# a cell whose smoke report is not among this run's artifacts (a promote-only dispatch,
	# another target's cells) gets its verdict from its release record, never "no report"
	$(PY) build.py resume --tag "$$RELEASE_TAG" --target all --verdict-dir build >/dev/null
	$(PY) build.py notes --tag "$$RELEASE_TAG" --target all --smoke-dir build \
	  --plot-dir build/release-assets --asset-url "$$ASSET_URL" > build/release-notes.md

github-release:  ## create the release, or refresh its notes and assets when re-run: every file the notes link (plots, histories, compose files)
	mapfile -t assets < <(find build/release-assets -type f | sort); \
	if gh release view "$$RELEASE_TAG" >/dev/null 2>&1; then \
	  gh release edit "$$RELEASE_TAG" --notes-file build/release-notes.md; \
	  [ "$${#assets[@]}" -eq 0 ] || gh release upload --clobber "$$RELEASE_TAG" "$${assets[@]}"; \
	else \
	  gh release create "$$RELEASE_TAG" --verify-tag --title "$$RELEASE_TAG" --latest=false \
	    --notes-file build/release-notes.md "$${assets[@]}"; \
	fi

# A run in which a cell failed never reaches promote: the run's summary says which cells
# failed and how, and that latest stayed (the same file is kept with the run's artifacts).
# Make's echo goes to the log only: the summary gets what tee reads.
.PHONY: not-promoted
not-promoted:  ## which cells of $$RELEASE_TAG failed (their smoke reports under build/) and that nothing was promoted
	mkdir -p build
	$(PY) build.py notes --not-promoted --tag "$$RELEASE_TAG" --target "$${RELEASE_TARGET:-all}" \
	  --smoke-dir build > build/not-promoted.md
	tee -a "$${GITHUB_STEP_SUMMARY:-/dev/null}" < build/not-promoted.md

rehearse-release:  ## before pushing a tag: release.yml run by act on this machine for $(TAG) made on HEAD (RELEASE_TARGET, default: the target fitting this host; the registry of IMAGEBUILD_REGISTRY)
	$(PY) -m tools.rehearse_release --tag "$(TAG)" $${RELEASE_TARGET:+--target "$$RELEASE_TARGET"}

rollback:
	$(PY) build.py rollback --tag "$$ROLLBACK_TO" $${ROLLBACK_IMAGE:+--image "$$ROLLBACK_IMAGE"}

# GitHub's "Latest" badge goes to the release the registry's latest holds (the newest
# release any image's latest points to), after each move of latest: promote and rollback.
# A tag without a GitHub release (never promoted by the workflow) leaves the badge alone.
release-badge:  ## mark the GitHub release of the registry's latest as Latest
	short=$$($(PY) -m imagebuild.release.badge); \
	if [ -z "$$short" ]; then echo "release-badge: no latest in the registry yet"; \
	elif gh release view "$$short" >/dev/null 2>&1; then gh release edit "$$short" --latest; \
	  echo "release-badge: $$short is Latest"; \
	else echo "release-badge: latest holds $$short, which has no GitHub release: the badge stays"; fi

pins-watch:
	$(PY) build.py pins watch --format markdown --out $(PINS_DIR) \
	  | tee -a "$${GITHUB_STEP_SUMMARY:-/dev/null}"

pin-issues:  ## one open issue per moved pin, found by its exact title and updated in place; closed only once the watch saw its pin current again
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
	# closed: only the watch's own issues (its marker in the body), and only for a pin it
	# saw at the locked commit this time (an unreachable Hub closes nothing)
	[ -f $(PINS_DIR)/watched.tsv ] || { echo "pin-issues: no $(PINS_DIR)/watched.tsv (the watch did not finish): no issue closed" >&2; exit 0; }; \
	awk -F '\t' '$$1 == "current" { print $$2 }' $(PINS_DIR)/watched.tsv > $(PINS_DIR)/.current; \
	gh issue list --label pin-watch --state open --limit 200 --json number,title,body \
	  --jq '.[] | select(.body | contains("<!-- imagebuild pins watch -->")) | [.number, .title] | @tsv' \
	  | while IFS=$$'\t' read -r num title; do \
	    ! grep -qxF -- "$$title" $(PINS_DIR)/.current || \
	      gh issue close "$$num" --comment "The pin is locked at its upstream head again (build.py pins watch saw it current): closed by the pins workflow."; \
	  done

# In a public repository GitHub disables a scheduled workflow after 60 days without
# activity: each run re-enables pins.yml through the REST API (PUT
# .../actions/workflows/pins.yml/enable), which starts that count again
pins-keepalive:  ## keep pins.yml's schedule from being disabled for inactivity
	gh api --method PUT "repos/$$GITHUB_REPOSITORY/actions/workflows/pins.yml/enable"
