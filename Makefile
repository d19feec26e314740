# Two commands set up a fresh machine:  `make book`  and  `make test`.
# Both create .venv (if needed) from requirements.txt first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup book test clean

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
