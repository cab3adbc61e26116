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

# GPU profile: its own venv and constraints (requirements-gpu.txt), SGLang's CUDA torch.
# requirements-gpu.txt resolves for Python 3.11 and 3.12 only, so not for a plain `python3` on
# Ubuntu 22.04 (3.10): the first of python3.12 and python3.11 on PATH, else install-gpu says
# what to install.
GPU_PYTHON ?= $(firstword $(foreach p,python3.12 python3.11,$(shell command -v $(p) 2>/dev/null)))
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed
# The interpreter `make test-gpu` uses; GPU_PY=python3 on an image prepared by hand (../shared/GPU.md).
GPU_PY ?= $(GPU_VENV)/bin/python

.PHONY: install install-gpu install-serve demo reproduce reproduce-table2 reproduce-conclusive replay-falls rl-budget rehearse-8b test test-unit test-server test-gpu gpu-check gpu-check-dry serve serve-stop ui bench bench-gpu clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e .
	touch $(STAMP)

install: $(STAMP)

# SGLang first: it brings the CUDA torch that DeepSpeed's source build then imports
# (no build isolation; DeepSpeed's CUDA ops are JIT-built on first use).
$(GPU_STAMP): pyproject.toml requirements-gpu.txt
	@$(GPU_PYTHON) -c 'import sys, ensurepip; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12)))' 2>/dev/null || { \
	  echo "make install-gpu: needs Python 3.11 or 3.12 with its venv module (requirements-gpu.txt resolves for those"; \
	  echo "only); GPU_PYTHON is '$(GPU_PYTHON)'. Install one, e.g. on Ubuntu 22.04 (python3 is 3.10):"; \
	  echo "  sudo apt install python3.11 python3.11-venv   (from the deadsnakes PPA where apt has none)"; \
	  echo "or point GPU_PYTHON at one: make install-gpu GPU_PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(GPU_VENV)/bin/python || $(GPU_PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -q -c requirements-gpu.txt sglang
	DS_BUILD_OPS=0 $(GPU_VENV)/bin/python -m pip install -q --no-build-isolation -c requirements-gpu.txt -e '.[gpu]'
	touch $(GPU_STAMP)

install-gpu: $(GPU_STAMP)

# The inference server's own venv (.venv-serve): vLLM's CPU build here, PyPI's vllm on a GPU
# machine (scripts/install_serve.sh says why a venv of its own, and the install order).
SERVE_VENV := .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.installed
# The script picks its Python (3.11, else 3.12) unless PYTHON is given here (command line or environment).
$(SERVE_STAMP): requirements-serve.txt scripts/install_serve.sh
	SERVE_VENV=$(SERVE_VENV) $(if $(filter command line environment,$(origin PYTHON)),PYTHON=$(PYTHON)) bash scripts/install_serve.sh
	touch $(SERVE_STAMP)

install-serve: $(SERVE_STAMP)

# ARGS: extra `paravt run` arguments, e.g. ARGS="--set data.on_bad_rows=quarantine".
demo: $(STAMP)
	$(BIN)/paravt run --config $(CONFIG) $(ARGS)

# The miniature reproduction (docs/miniature.md): by default vanilla GRPO against PARA-GRPO,
# 4 runs each; reproduce-table2 adds Table 2's anchoring-only and gating-only rows (SPEC §6).
reproduce: $(STAMP)
	$(BIN)/paravt reproduce --config conf/pipeline/reproduce.yaml $(ARGS)

reproduce-table2: $(STAMP)
	$(BIN)/paravt reproduce --config conf/pipeline/reproduce.yaml \
	  --set 'reproduce.rows=[vanilla_grpo,paragrpo,anchoring_only,gating_only]' $(ARGS)

# The replay and the budget profile ran on the RL settings the default had before it adopted the
# budget they chose (docs/miniature.md, "Choosing the RL budget on validation"); they keep them, so
# their variants mean what their reports say and their runs come from their caches.
EARLIER_BUDGET := --set rl.learning_rate=1.0e-4 --set rl.max_steps=12 --set rl.shared_prefix=false

# The replay of PARA-GRPO's falls (#62; docs/miniature.md "Replaying the falls"): the falling seeds
# (REPLAY_SEEDS) once per variant, one RL switch at a time, in the default's output folder, so the
# world, pretraining, SFT and the SFT model's measurements come from its cache (the default's
# threads, one per run). Report: outputs/reproduce/report-replay-falls; MLflow: paravt-replay-falls.
REPLAY_SEEDS ?= [1,3]
replay-falls: $(STAMP)
	$(BIN)/paravt reproduce --config conf/pipeline/reproduce.yaml \
	  --set 'reproduce.rows=[paragrpo]' --set 'reproduce.seeds=$(REPLAY_SEEDS)' $(EARLIER_BUDGET) \
	  --set 'reproduce.variants={unchanged: [], lr_half: [rl.learning_rate=5.0e-5], subagents_untrained: [rl.train_subagents=false], draw_key_1: [rl.gating.draw_key=1], kl_in_loss: [rl.kl_mode=loss]}' \
	  --set reproduce.report_dir=report-replay-falls --set mlflow.experiment=paravt-replay-falls $(ARGS)

# The RL budget chosen on validation (#62 item 3; docs/miniature.md "Choosing the RL budget on
# validation"): vanilla GRPO at each learning rate and step count, once per seed (BUDGET_SEEDS), in
# the default's output folder (its world, pretraining and SFT from the cache); the report's "RL budget
# chosen on validation" applies `miniature.budget_choice`. Report: outputs/reproduce/report-rl-budget.
BUDGET_SEEDS ?= [0,1,2,3]
rl-budget: $(STAMP)
	$(BIN)/paravt reproduce --config conf/pipeline/reproduce.yaml \
	  --set 'reproduce.rows=[vanilla_grpo]' --set 'reproduce.seeds=$(BUDGET_SEEDS)' $(EARLIER_BUDGET) \
	  --set 'reproduce.variants={lr1e4_s12: [], lr5e5_s12: [rl.learning_rate=5.0e-5], lr1e4_s24: [rl.max_steps=24], lr5e5_s24: [rl.learning_rate=5.0e-5, rl.max_steps=24]}' \
	  --set reproduce.rl_validation=true --set reproduce.report_dir=report-rl-budget \
	  --set mlflow.experiment=paravt-rl-budget $(ARGS)

# The default's contrast with the SFT build as a level (#62 item 4; docs/miniature.md "A profile that
# can conclude"): CONCLUSIVE_BUILDS SFT builds (sft.seed) from the default's one pretraining, each
# training the default's rows x seeds, in the default's output folder. The size is the least the
# default's run spreads allow, taking builds to differ no more than runs do. Report:
# outputs/reproduce/report-conclusive; MLflow: paravt-reproduce-conclusive. On machines that do not last
# its day, in parts, each a set of builds with a report of its own, merged after (docs/miniature.md):
#   make reproduce-conclusive CONCLUSIVE_BUILDS=[0,1] CONCLUSIVE_REPORT=report-conclusive-0-1
#   make reproduce-conclusive CONCLUSIVE_BUILDS=[2,3] CONCLUSIVE_REPORT=report-conclusive-2-3 CONCLUSIVE_SWEEP=false
#   paravt miniature report --from outputs/reproduce/report-conclusive-0-1 --from ... --out <folder> --log-to paravt-reproduce-conclusive
CONCLUSIVE_BUILDS ?= [0,1,2,3,4,5,6,7,8,9,10,11,12]
CONCLUSIVE_REPORT ?= report-conclusive
# false in a part whose builds are not the profile's first: the merge takes the first part's sweep.
CONCLUSIVE_SWEEP ?= true
reproduce-conclusive: $(STAMP)
	$(BIN)/paravt reproduce --config conf/pipeline/reproduce.yaml \
	  --set 'reproduce.sft_seeds=$(CONCLUSIVE_BUILDS)' --set 'reproduce.report_dir=$(CONCLUSIVE_REPORT)' \
	  --set reproduce.budget_sweep=$(CONCLUSIVE_SWEEP) --set mlflow.experiment=paravt-reproduce-conclusive $(ARGS)

# A dress rehearsal of the 8B run on this CPU (docs/scale.md "The first 8B run"): paravt_8b.yaml's own
# pipeline end to end, every process where it puts them, the tiny model and small sizes; the device
# ledger checks the memory plan's claims of every process. Its server tier test: tests/server/test_rehearse_8b.py.
rehearse-8b: $(STAMP) $(SERVE_STAMP)
	$(BIN)/paravt rehearse --config conf/pipeline/paravt_8b.yaml $(ARGS)

# TEST_WORKERS: pytest-xdist workers (auto: one per core, at most 4; 0 runs in this process).
TEST_WORKERS ?= auto
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --maxprocesses 4 --dist load --maxschedchunk 2)
# Bytecode written for the project's own modules even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE=1): the suite starts hundreds of Python processes (ranks, CLI
# commands), and each compiled paravt_core from source again: 1-2 CPU s per rank
# (docs/speed.md). __pycache__/ is ignored by git.
TEST_ENV = PYTHONDONTWRITEBYTECODE=

test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest tests -m "not server" $(XDIST) --durations 15

# The server tier: a real vLLM (from .venv-serve) serving tiny Qwen3-VL models; fails, not
# skips, when the serve venv is missing (PARAVT_SERVER_TIER=1).
test-server: $(STAMP) $(SERVE_STAMP)
	PARAVT_SERVER_TIER=1 $(BIN)/python -m pytest tests/server -m server -rs

test-unit: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest tests -m "not integration and not gpu and not server"

# The gpu tier on one CUDA GPU; refuses to "pass" by skipping everything on a machine without one.
test-gpu:
	@test -x $(GPU_PY) || command -v $(GPU_PY) >/dev/null || { echo "no $(GPU_PY): run make install-gpu, or GPU_PY=python3 on a prepared image"; exit 1; }
	$(GPU_PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: no CUDA GPU is visible')"
	PYTHONUNBUFFERED=1 $(GPU_PY) -m pytest $$(grep -rl "pytest.mark.gpu" tests --include='test_*.py') -m gpu -rs

# The GPU proof in one command (scripts/gpu_check.py): wheels from .whl, by default issue #47's
# 8B-shape memory cases and 2B-shape SFT switches; logs and summary.json under OUT.
# gpu-check-dry checks it on CPU and runs the benchmarks' CPU modes with the project's venv.
OUT ?= outputs/gpu-check
gpu-check:
	python3 scripts/gpu_check.py --out $(OUT)

gpu-check-dry:
	$(BIN)/python scripts/gpu_check.py --out $(OUT) --dry-run

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
	for b in bench/*.py; do case $$b in *_gpu.py) continue;; esac; $(BIN)/python $$b || exit 1; done

# GPU benchmarks (bench/*_gpu.py): SFT tokens/s and MFU at the 2B shape on one GPU.
bench-gpu:
	@test -x $(GPU_PY) || command -v $(GPU_PY) >/dev/null || { echo "no $(GPU_PY): run make install-gpu, or GPU_PY=python3 on a prepared image"; exit 1; }
	PYTHONUNBUFFERED=1 $(GPU_PY) bench/sft_gpu.py
	PYTHONUNBUFFERED=1 $(GPU_PY) bench/rl_gpu.py

clean:
	rm -rf outputs .prefect mlruns
