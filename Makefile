# Two commands do all set-up: `make demo` and `make test` build .venv from nothing on first use.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench lab clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch, pinned: a loose `torch` pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,viz]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/spyre-lab demo

test: $(STAMP)
	$(BIN)/ruff check spyre_lab tests benchmarks scripts
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lab: $(STAMP)
	$(BIN)/jupyter lab --no-browser

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
