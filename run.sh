#!/usr/bin/env bash
# seal_mini entry point.
#   bash run.sh [recipes/X.yaml] [key.sub=value ...]   set up .venv, then train -> eval -> report
#   bash run.sh test [pytest args]                    set up .venv, then run the tests
#   SEAL_MINI_GPUS=N bash run.sh ...                  the same on N GPUs (N ranks under torchrun); =all: every
#                                                     visible GPU (CUDA_VISIBLE_DEVICES, else all nvidia-smi lists)
#   bash run.sh wheels DIR                            (with network) download every wheel setup needs into DIR
#   SEAL_MINI_WHEELS=DIR bash run.sh ...              set up from that folder alone, no index (a machine offline)
#   SEAL_MINI_SYSTEM_SITE=1 bash run.sh ...           keep the torch, transformers and peft the machine has, where
#                                                     they are within seal_mini.SUPPORTED (install only the rest)
# Optional extras are installed when the recipe needs them, and for the tests: requirements-ood.txt when it
# names ood.suites, requirements-log.txt when its log.backends name tensorboard.
set -euo pipefail
cd "$(dirname "$0")"

VENV=${SEAL_MINI_VENV:-.venv}
PY="$VENV/bin/python"

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

pip_install() {
  # From the wheel folder alone when SEAL_MINI_WHEELS names one (no index is ever asked), else the index.
  if [ -n "${SEAL_MINI_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$SEAL_MINI_WHEELS" "$@"
  else
    "$PY" -m pip install -q "$@"
  fi
}

kept() {
  # With SEAL_MINI_SYSTEM_SITE: a copy of a requirements file without the pins of torch, transformers and
  # peft where the machine itself (not the venv) has them within seal_mini.SUPPORTED; otherwise the file.
  if [ -z "${SEAL_MINI_SYSTEM_SITE:-}" ]; then echo "$1"; return; fi
  local out="$VENV/.kept_$(basename "$1")"
  "$PY" - "$1" > "$out" <<'PYTHON' || { rm -f "$out"; return 1; }
import ast, importlib.metadata as md, pathlib, re, sys
supported = ast.literal_eval(re.search(r"SUPPORTED = (\{.*?\})", open("seal_mini/__init__.py").read()).group(1))
key = lambda v: tuple(int(p) for p in re.findall(r"\d+", v.split("+")[0])[:3])
venv = pathlib.Path(sys.prefix).resolve()
for line in open(sys.argv[1]):
    name = re.split(r"[=<>!~\[ ;#]", line.strip(), maxsplit=1)[0].lower()
    try:
        found = md.distribution(name) if name in supported else None
    except md.PackageNotFoundError:
        found = None
    machine = found is not None and venv not in pathlib.Path(found.locate_file("")).resolve().parents
    low, high = supported.get(name, ("0", "0"))
    if machine and key(low) <= key(found.version) < key(high):
        print(f"# {name} {found.version}: the machine's own")
    else:
        print(line.rstrip())
PYTHON
  echo "$out"
}

setup() {
  # Re-install only when a requirements file changed since the last successful setup.
  local stamp="$VENV/.seal_mini_setup"
  local want
  want=$( (cat requirements*.txt; echo "unsloth=${SEAL_MINI_UNSLOTH:-} system=${SEAL_MINI_SYSTEM_SITE:-}") | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  echo "[run.sh] setting up $VENV (first run takes a few minutes)${SEAL_MINI_WHEELS:+, from $SEAL_MINI_WHEELS alone}"
  [ -x "$PY" ] || python3 -m venv ${SEAL_MINI_SYSTEM_SITE:+--system-site-packages} "$VENV"
  [ -n "${SEAL_MINI_WHEELS:-}" ] || "$PY" -m pip install -q --upgrade pip
  local core dev
  core=$(kept requirements.txt) && dev=$(kept requirements-dev.txt) || exit 1
  pip_install -r "$core" -r "$dev"
  pip_install --no-deps -r requirements-nodeps.txt
  # unsloth is opt-in (model.backend: unsloth, experimental): SEAL_MINI_UNSLOTH=1 bash run.sh ...
  if has_gpu && [ -n "${SEAL_MINI_UNSLOTH:-}" ]; then
    echo "[run.sh] CUDA GPU found and SEAL_MINI_UNSLOTH set: installing the unsloth extra (requirements-gpu.txt)"
    pip_install -r requirements-gpu.txt -c "$core" \
      || echo "[run.sh] unsloth did not install; the hf backend (bitsandbytes + peft) will be used"
  fi
  "$PY" -c 'from seal_mini.engine.device import supported_versions as s; m = s(); print("[run.sh] " + m) if m else None'
  echo "$want" > "$stamp"
}

wheels() {
  # Every wheel setup installs (the core, dev and optional extras, bfcl-eval), for this Python and platform,
  # into a folder: copy it with the checkout to a machine without network and set SEAL_MINI_WHEELS to it.
  local dir=${1:?"bash run.sh wheels DIR: name the folder"}
  mkdir -p "$dir"
  python3 -m pip download -q -d "$dir" -r requirements.txt -r requirements-dev.txt -r requirements-ood.txt \
    -r requirements-log.txt -c requirements.txt
  python3 -m pip download -q -d "$dir" --no-deps -r requirements-nodeps.txt
  python3 -m pip download -q -d "$dir" pip setuptools wheel
  echo "[run.sh] $(ls "$dir" | wc -l) files, $(du -sh "$dir" | cut -f1) in $dir: SEAL_MINI_WHEELS=$dir bash run.sh ..."
}

setup_extra() {
  # An optional extra (requirements-ood.txt, requirements-log.txt), only when asked for, with the core pins
  # as constraints so they hold.
  local file=$1 stamp="$VENV/.seal_mini_setup_$1"
  local want
  want=$(cat requirements.txt "$file" | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  echo "[run.sh] installing the optional extra $file"
  local core
  core=$(kept requirements.txt) || exit 1
  pip_install -r "$file" -c "$core"
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

if [ "${1:-}" = "wheels" ]; then
  wheels "${2:-}"
  exit 0
fi

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
