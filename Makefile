# paravt-pipeline: the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= conf/pipeline/tiny.yaml
PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 60
export PREFECT_HOME ?= $(CURDIR)/.prefect
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-unit serve serve-stop ui bench clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e .
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/paravt run --config $(CONFIG)

test: $(STAMP)
	$(BIN)/python -m pytest tests

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests -m "not integration and not gpu"

# Loopback Prefect server + process work pool + deployments + worker, then
# `prefect deployment run paravt/full-pipeline` runs the pipeline.
serve: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/serve.sh start

serve-stop:
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/serve.sh stop

# Prefect UI on http://127.0.0.1:$(PREFECT_PORT) (via `make serve`) and MLflow UI on http://127.0.0.1:$(MLFLOW_PORT).
ui: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH bash scripts/serve.sh ui

bench: $(STAMP)
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[bench]'
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf outputs .prefect mlruns
