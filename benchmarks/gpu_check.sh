#!/usr/bin/env bash
# GPU check, prepared to run in one go (at most 240+20+90+130+100+60 s = 10.7 minutes of step limits) on a machine with an NVIDIA GPU, from the
# repository root:   bash benchmarks/gpu_check.sh
# 1. installs the project (.venv, `make install model`) and GPU vLLM in its own env (`make vllm`);
# 2. serves SmolLM2-135M and a randomly initialised Llama-3-8B-shaped model (vLLM --load-format dummy)
#    through the managed policy (flywheel/policy/vllm_server.py) and plays rollouts on WebShop and
#    ScienceWorld (ScienceWorld needs Java 17: installed with apt-get where missing);
# 3. times one SFT step of the 8B shape with LoRA r16 + gradient checkpointing (bf16, random init);
# 4. packed SFT on the GPU path (FlexAttention tree masks): SmolLM2's log-probs and gradient against per step.
# Every number goes to benchmarks/results/gpu_check.json; each step has its own time limit, and a
# step that fails is recorded there and does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/gpu_check.json
LOG=benchmarks/results/gpu_check.log
mkdir -p benchmarks/results
: > "$LOG"
start=$(date +%s)
step() {  # step NAME SECONDS CMD...: run with a time limit, log, record its exit code and time
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s)" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
  echo "$name $rc $(( $(date +%s) - t0 ))" >> benchmarks/results/gpu_check.steps
}
rm -f "$OUT" benchmarks/results/gpu_check.steps
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"

# The two environments are built side by side (downloads overlap).
step install 240 make install model &
step vllm_env 240 make vllm &
if ! command -v java >/dev/null 2>&1; then
  step java 200 bash -c "apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless" &
fi
wait

PY=.venv/bin/python
SMOL=.cache/models/smollm2-135m
BIG=.cache/models/llama3-8b-shape
step make_8b 20 $PY benchmarks/gpu_check.py make-8b "$BIG" --tokenizer-from "$SMOL"
step rollouts_smollm2 90 $PY benchmarks/gpu_check.py rollouts smollm2 "$SMOL" --episodes 16 --max-steps 5 \
  --server-arg=--enforce-eager
step rollouts_8b 130 $PY benchmarks/gpu_check.py rollouts llama3-8b-shape "$BIG" --episodes 16 --max-steps 5 \
  --server-arg=--load-format --server-arg=dummy --server-arg=--gpu-memory-utilization --server-arg=0.6 --server-arg=--enforce-eager
step sft_step_8b 100 $PY benchmarks/gpu_check.py sft-step --seq-len 1024 --batch 4
step packed_sft 60 $PY benchmarks/gpu_check.py packed-sft "$SMOL"

$PY - <<'EOF' >> "$LOG" 2>&1
import json, pathlib
p = pathlib.Path("benchmarks/results/gpu_check.json")
data = json.loads(p.read_text()) if p.exists() else {}
steps = pathlib.Path("benchmarks/results/gpu_check.steps")
data["steps"] = [dict(zip(("step", "exit", "seconds"), l.split())) for l in steps.read_text().splitlines()] if steps.exists() else []
p.write_text(json.dumps(data, indent=2))
EOF
echo "gpu_check: $(( $(date +%s) - start ))s in all; numbers in $OUT, log in $LOG"
cat "$OUT" 2>/dev/null | head -80
