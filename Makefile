# Two commands, each works from nothing on a fresh machine:
#   make run    set up .venv and run the main job (inductionlab analyze) on the embedded SmolLM2
#   make test   set up .venv and run the test suite
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup run test test-all
setup:
	bash scripts/setup.sh

run: setup
	$(BIN)/inductionlab analyze $(ARGS)

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
