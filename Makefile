# Two commands set up a fresh machine:  `make book`  and  `make test`.
# Both create .venv (if needed) from requirements.txt first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup book test clean hub hub-stop

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# Build the course book into _build/html (strict: a warning or a failing cell fails it).
book: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter-book build book

# The whole test suite; GPU-only tests skip themselves without a GPU.
test: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest

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
