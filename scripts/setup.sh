#!/usr/bin/env bash
# Create .venv and install txl into it. Usage: bash scripts/setup.sh [test]
#   test: also install the test dependencies (pytest, pytest-xdist, hypothesis, transformers==4.35.2 as an oracle,
#   scikit-learn for the TF-IDF baseline, onnx/onnxscript/onnxruntime for the exported decoder).
# torch is installed first, pinned, so that pip never replaces it with another build:
#   TXL_TORCH="torch==2.13.0" (default; on this kind of machine pip takes the CPU wheel already on disk).
#   Elsewhere, a CPU-only machine: TXL_TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   A GPU machine: install the CUDA build that matches your driver into .venv first (see pytorch.org),
#   then run this script with TXL_TORCH=skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
TORCH=${TXL_TORCH:-torch==2.13.0}
if [ "$TORCH" != skip ]; then
  if [ -n "${TXL_TORCH_INDEX:-}" ]; then
    "${PIP[@]}" "$TORCH" --index-url "$TXL_TORCH_INDEX"
  else
    "${PIP[@]}" "$TORCH"
  fi
fi
# the package was installed as "txl" before it became txl-transformer-xl ("txl" on PyPI is another project):
# a .venv from then keeps that entry, which would claim the same `txl` import name and command
if .venv/bin/python -m pip show --quiet txl >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall --quiet --yes txl
fi
if [ "${1:-}" = test ]; then
  "${PIP[@]}" -e ".[test]"
else
  "${PIP[@]}" -e .
fi
.venv/bin/python -c "import torch, txl; print(f'txl {txl.__version__} with torch {torch.__version__} ready in .venv')"
