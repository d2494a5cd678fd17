# Two commands do all set-up: `make demo` and `make test` build .venv from nothing on first use.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test nbval notebooks measure-notebooks check-views lab lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch, pinned: a loose `torch` pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[dev,viz,serve,sweep]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/spyre-lab demo

# Notebooks run the way they were committed: one thread, plotly's mimetype renderer (no plotly.js embedded).
NB_ENV   := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PLOTLY_RENDERER=plotly_mimetype PYTHONHASHSEED=0
NB_DIRS  := tutorials notebooks

test: $(STAMP)
	$(BIN)/ruff check spyre_lab tests benchmarks scripts
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory nbval

# Every committed notebook re-executed and compared cell by cell with its stored outputs (strict; volatile
# text is normalised by tutorials/nbval_sanitize.cfg, never by skipping a cell).
nbval: $(STAMP)
	$(NB_ENV) $(BIN)/python -m pytest -q --nbval --nbval-current-env --nbval-cell-timeout=300 \
		--nbval-sanitize-with tutorials/nbval_sanitize.cfg -p no:cacheprovider $(NB_DIRS)

# Re-execute every notebook in place, ready to commit (saved widget state and a static picture of each view,
# drawn in Debian's chromium); then measure each one on one core.
notebooks: $(STAMP)
	$(NB_ENV) $(BIN)/python scripts/run_notebooks.py $(NB_DIRS)

measure-notebooks: $(STAMP)
	$(BIN)/python scripts/measure_notebooks.py $(NB_DIRS)

# Five Run-All passes of every notebook in JupyterLab under load, every control moved: views moved / frozen.
check-views: $(STAMP)
	$(BIN)/python scripts/check_views_in_browser.py $(NB_DIRS)

bench: $(STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# JupyterLab with the file browser on tutorials/ (the workshop starts at 01_tour.ipynb).
lab: $(STAMP)
	$(BIN)/python -m jupyterlab --LabApp.default_url=/lab/tree/tutorials

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
