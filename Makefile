# The two commands of the README. Each creates or reuses .venv and installs what it needs.
# `make test` is the fast tier (minutes), one pytest-xdist worker per core, a test file's tests on one
# worker (their module fixtures made once); `make test-slow` the tests marked slow (pyproject.toml's
# [tool.pytest.ini_options] says what that means), one at a time, since most are real runs whose
# limits a second worker beside them would strain. CI (.ci/run) runs both, the fast tier first.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test test-slow lint venv clean

demo: $(STAMP)
	$(VENV)/bin/autoresearch demo $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -m "not slow" -n auto --dist loadfile $(ARGS)

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -m slow $(ARGS)

# ruff's lint and format rules (pyproject.toml); `ruff format .` fixes what the second one finds
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

venv: $(STAMP)

$(STAMP):
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	# torch first and alone, pinned, so that pip never resolves a different build for it
	$(VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VENV)/bin/python -m pip install --quiet -e '.[train,dev]'
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV)
