# The README's quick start:  `make book`  (build the book to read),  `make test-fast`  (the
# unit tests, a few minutes)  and  `make test`  (the whole suite, what CI runs).  Each creates
# .venv (if needed) first: torch at requirements.txt's pin, then everything else at the exact
# versions and hashes of requirements.lock, then the course itself.  `make lab` starts
# JupyterLab; `make lock` remakes requirements.lock after a change to requirements.txt or to
# pyproject.toml's dependencies.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN    := PATH="$(abspath $(BIN)):$$PATH"

# PyTorch's wheels from another index, for example its CPU-only build on a machine without a
# GPU:  make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (PyPI's torch is the CUDA build, which brings about 2.7 GB of nvidia-* packages). Only the
# torch wheel comes from that index, at the version requirements.txt pins; everything else,
# torch's own dependencies included, comes from the usual index through requirements.lock.
# torch is the one package installed by version alone: its CPU and CUDA builds share a version
# but not a file, so no hash in the lock could fit both (scripts/lock.py leaves it out, with
# the nvidia-* and cuda-* packages that only the CUDA build brings; without TORCH_INDEX, pip
# installs those with PyPI's torch).
TORCH_INDEX ?=
TORCH_PIN    = $(shell sed -n 's/^\(torch==[^ ]*\).*/\1/p' requirements.txt)
# setuptools announces every editable install with a multi-line notice ("Editable installation
# ... folders with the same name as your package"); the course's layout is the one it means.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

# System packages some tests use, installed by `make test` where it can (root and apt-get):
#   bubblewrap  the grading sandbox (tests/test_grading.py runs student code under bwrap)
#   chromium    the browser tests (tests/test_browser.py, tests/test_jupyterlab.py)
#   acl         the course hub's test (tests/test_hub.py): other accounts reach the environment
# Elsewhere the tests that need one skip, naming the command that installs it.
SYSTEM_PACKAGES := bubblewrap:bwrap chromium:chromium acl:setfacl
# Seconds apt-get waits for the package manager's lock (another apt-get, unattended upgrades).
APT_LOCK_WAIT ?= 300

# The unit tests: no browser, no grading run, no book build, nothing slow, nothing for a GPU
# (the markers are set in tests/conftest.py and listed in pyproject.toml).
FAST_TESTS := not slow and not gpu and not book and not browser and not grading

.PHONY: setup system-packages book test test-fast lint lab lab-instructor clean hub hub-stop \
        gpu-check gpu-wheels lock

# The environment: torch, then requirements.lock (pip refuses any file whose hash the lock does
# not list, and any package the lock does not pin), then the course itself (editable, its
# dependencies already there), then `pip check` (every installed package's requirements met).
$(STAMP): requirements.lock requirements.txt pyproject.toml scripts/ipython_kernel_config.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	@echo "make: installing the course's Python packages into $(VENV); README.md says how much" \
	      "it downloads and how long it takes"
ifneq ($(TORCH_INDEX),)
	$(BIN)/pip install --progress-bar on --no-deps --index-url $(TORCH_INDEX) "$(TORCH_PIN)"
else
	$(BIN)/pip install --progress-bar on "$(TORCH_PIN)"
endif
	$(BIN)/pip install --progress-bar on --require-hashes -r requirements.lock
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	mkdir -p $(VENV)/etc/ipython
	cp scripts/ipython_kernel_config.py $(VENV)/etc/ipython/ipython_kernel_config.py
	touch $(STAMP)

setup: $(STAMP)

# requirements.lock from requirements.txt and pyproject.toml (scripts/lock.py says what it
# leaves out and why); needs uv (pip install uv, or make lock UV=/path/to/uv).  Commit the two
# together: tests/test_packaging.py checks that they agree.
UV ?= uv
lock:
	$(PYTHON) scripts/lock.py --uv $(UV)

# Debian/Ubuntu packages, one at a time so that one unavailable package does not stop the
# others; apt-get waits for the package manager's lock, and what is there afterwards is what
# is reported (another process may install a package meanwhile, or apt-get may fail).
system-packages:
	@for entry in $(SYSTEM_PACKAGES); do \
	  package=$${entry%%:*}; program=$${entry##*:}; \
	  command -v $$program >/dev/null 2>&1 && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing the system package $$package (apt-get, waiting up to" \
	         "$(APT_LOCK_WAIT) s for the package manager's lock)"; \
	    log=$$(mktemp); \
	    { [ -n "$$updated" ] || { apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT) update -qq \
	                              && updated=1; }; } >"$$log" 2>&1; \
	    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT) \
	      install -y -qq $$package >>"$$log" 2>&1; status=$$?; \
	    if command -v $$program >/dev/null 2>&1; then \
	      echo "make: $$package is installed ($$(command -v $$program))"; \
	    else \
	      tail -n 5 "$$log"; \
	      echo "make: $$package is not installed (apt-get exit $$status); the tests that" \
	           "need it will skip"; \
	    fi; \
	    rm -f "$$log"; \
	  else \
	    echo "make: $$package is not installed; the tests that need it will skip" \
	         "(to run them: sudo apt-get install $$package)"; \
	  fi; \
	done

# Build the course book into _build/html (strict: a warning or a failing cell fails it).
book: $(STAMP)
	$(RUN) $(BIN)/jupyter-book build book

# The whole test suite, as CI runs it: each test module runs on one worker, the modules that
# build or read the book together, and the three that run a hub together (tests/conftest.py
# groups them); GPU-only tests skip themselves without a GPU.  Three workers on two cores: the
# hub modules mostly wait on servers and a browser, and the other two workers fill the cores
# meanwhile (on a 2-core machine 801 s with three, 916 s with two: results/suite_workers_cpu.txt).
test: $(STAMP) system-packages
	$(RUN) $(BIN)/python -m pytest -n 3 --dist loadscope

# The unit tests only (FAST_TESTS above); needs no system package.
test-fast: $(STAMP)
	$(RUN) $(BIN)/python -m pytest -m "$(FAST_TESTS)" -q -n 2 --dist loadscope

# The linter alone (the rules are pyproject.toml's [tool.ruff]; tests/test_lint.py runs it too).
lint: $(STAMP)
	$(BIN)/ruff check .

# JupyterLab on the course, from the course's environment (root needs --allow-root), serving
# the repository root: nbgrader's extensions need the course directory inside the server's root.
# `make lab LAB=lab00_the_idea` first makes the lab's student version (release/, if missing)
# and opens it.  `make lab` is the student's JupyterLab: scripts/jupyter/student turns off
# nbgrader's instructor tools (Create Assignment, formgrader, courses) and the news popup
# (scripts/jupyter/README.md); `make lab-instructor` keeps everything nbgrader installs.
LAB ?=
STUDENT_LAB := JUPYTER_CONFIG_PATH="$(CURDIR)/scripts/jupyter/student$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}"
JUPYTER_LAB = $(RUN) PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(BIN)/jupyter lab \
	  --ServerApp.root_dir="$(CURDIR)" $(if $(LAB),release/$(LAB)/$(LAB).ipynb) \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root)
lab lab-instructor: $(STAMP)
ifneq ($(LAB),)
	@test -f release/$(LAB)/$(LAB).ipynb || \
	  $(RUN) $(BIN)/nbgrader generate_assignment $(LAB) --log-level=WARN
endif
	$(if $(filter lab,$@),$(STUDENT_LAB)) $(JUPYTER_LAB)

clean:
	rm -rf _build release submitted autograded feedback autograde_status

# The course on a JupyterHub on this machine (root: every user's server runs as a system
# account of its own), on http://127.0.0.1:8000/ until Ctrl-C or `make hub-stop`.
# book/hub.md is the instructor's guide.
HUB_STATE ?= /srv/msda-hub
hub: $(STAMP)
	$(BIN)/python scripts/hub/hub.py setup --state $(HUB_STATE)
	$(BIN)/python scripts/hub/hub.py start --state $(HUB_STATE)

hub-stop:
	$(BIN)/python scripts/hub/hub.py stop --state $(HUB_STATE)

# The GPU path in one call, on a CUDA host: the GPU tests, every lab's source notebook, lab 10's
# suite, the fixture class graded on the GPU and a benchmark smoke (scripts/gpu/check.py; about
# 8 minutes on an H200 host).  It runs with the host's python3 (torch and Triton installed, no
# virtualenv); nbgrader and nbclient come from .whl/ where the host lacks them (make gpu-wheels,
# on a machine with pip and the network).  Results: $(GPU_CHECK_OUT)/gpu_check_<gpu>.json.
GPU_CHECK_OUT ?= gpu_check_out
gpu-check:
	$(PYTHON) scripts/gpu/check.py $(GPU_CHECK_OUT)

gpu-wheels:
	grep -v '^#' scripts/gpu/wheels.txt | xargs $(PYTHON) -m pip download --no-deps \
	  --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 \
	  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl
	# Debian's bubblewrap for the grading sandbox there (the grading part of scripts/gpu/run.py unpacks it)
	-mkdir -p .whl/deb && cd .whl/deb && apt-get download bubblewrap libcap2 libselinux1
