#!/usr/bin/env bash
# seal_mini entry point.
#   bash run.sh [recipes/X.yaml] [key.sub=value ...]   set up .venv, then train -> eval -> report
#   bash run.sh test [pytest args]                    set up .venv, then run the tests
#   SEAL_MINI_GPUS=N bash run.sh ...                  the same on N GPUs (N ranks under torchrun); =all: every
#                                                     visible GPU (CUDA_VISIBLE_DEVICES, else all nvidia-smi lists)
# Optional extras are installed when the recipe needs them, and for the tests: requirements-ood.txt when it
# names ood.suites, requirements-log.txt when its log.backends name tensorboard.
set -euo pipefail
cd "$(dirname "$0")"

VENV=${SEAL_MINI_VENV:-.venv}
PY="$VENV/bin/python"

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

setup() {
  # Re-install only when a requirements file changed since the last successful setup.
  local stamp="$VENV/.seal_mini_setup"
  local want
  want=$( (cat requirements*.txt; echo "unsloth=${SEAL_MINI_UNSLOTH:-}") | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  echo "[run.sh] setting up $VENV (first run takes a few minutes)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r requirements.txt -r requirements-dev.txt
  "$PY" -m pip install -q --no-deps -r requirements-nodeps.txt
  # unsloth is opt-in (model.backend: unsloth, experimental): SEAL_MINI_UNSLOTH=1 bash run.sh ...
  if has_gpu && [ -n "${SEAL_MINI_UNSLOTH:-}" ]; then
    echo "[run.sh] CUDA GPU found and SEAL_MINI_UNSLOTH set: installing the unsloth extra (requirements-gpu.txt)"
    "$PY" -m pip install -q -r requirements-gpu.txt -c requirements.txt \
      || echo "[run.sh] unsloth did not install; the hf backend (bitsandbytes + peft) will be used"
  fi
  echo "$want" > "$stamp"
}

setup_extra() {
  # An optional extra (requirements-ood.txt, requirements-log.txt), only when asked for, with the core pins
  # as constraints so they hold.
  local file=$1 stamp="$VENV/.seal_mini_setup_$1"
  local want
  want=$(cat requirements.txt "$file" | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  echo "[run.sh] installing the optional extra $file"
  "$PY" -m pip install -q -r "$file" -c requirements.txt
  echo "$want" > "$stamp"
}

# What optional extras a recipe needs: "ood" if it names ood.suites, "log" if its log.backends name
# tensorboard; nothing if the recipe does not load (the pipeline then reports what is wrong with it).
recipe_extras() {
  "$PY" -c 'import sys
from seal_mini.config import load_config
cfg = load_config(sys.argv[1], sys.argv[2:])
print("ood" * bool(cfg.ood.suites), "log" * ("tensorboard" in cfg.log.backends))' "$@" 2>/dev/null || true
}

export HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false

if [ "${1:-}" = "test" ]; then
  shift
  setup
  setup_extra requirements-ood.txt  # the tests run every suite on a few tasks
  setup_extra requirements-log.txt  # and read TensorBoard's event files back
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 exec "$PY" -m pytest "$@"
fi

recipe=${1:-}
if [ -z "$recipe" ] || [[ "$recipe" == *=* ]]; then
  if has_gpu; then
    echo "[run.sh] no recipe given; a CUDA GPU is present, so recipes/qwen2_5_3b.yaml"
    recipe=recipes/qwen2_5_3b.yaml
  else
    echo "[run.sh] no recipe given; no CUDA GPU here, so recipes/cpu_learn.yaml (practice tasks, a small model built from scratch)"
    recipe=recipes/cpu_learn.yaml
  fi
else
  shift
fi
setup
extras=$(recipe_extras "$recipe" "$@")
if [[ "$extras" == *ood* ]]; then setup_extra requirements-ood.txt; fi
if [[ "$extras" == *log* ]]; then setup_extra requirements-log.txt; fi
ranks=${SEAL_MINI_GPUS:-1}
if [ "$ranks" = "all" ]; then
  ranks=$("$PY" -c 'from seal_mini.programs.placement import visible_gpus; print(len(visible_gpus()))')
  if [ "$ranks" -lt 1 ]; then echo "[run.sh] SEAL_MINI_GPUS=all, but no GPU is visible" >&2; exit 2; fi
fi
if ! [[ "$ranks" =~ ^[1-9][0-9]*$ ]]; then
  echo "[run.sh] SEAL_MINI_GPUS=$SEAL_MINI_GPUS: give a number of GPUs (e.g. 4) or all" >&2; exit 2
fi
if [ "$ranks" -gt 1 ]; then
  echo "[run.sh] data parallel over $ranks ranks: torchrun --standalone --nproc-per-node $ranks"
  exec "$PY" -m torch.distributed.run --standalone --nproc-per-node "$ranks" -m seal_mini pipeline "$recipe" "$@"
fi
exec "$PY" -m seal_mini pipeline "$recipe" "$@"
