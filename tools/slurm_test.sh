#!/usr/bin/env bash
# Testing on a slurm cluster: one task per GPU through srun, mmengine's slurm launcher.
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS="..."] \
#   tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]
# PYTHON selects the interpreter (default: python on the PATH).
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(( GPUS < 8 ? GPUS : 8 ))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
read -r -a EXTRA_SRUN <<< "${SRUN_ARGS:-}"
PYTHONPATH="$(dirname "$0")/..:${PYTHONPATH:-}" \
srun -p "$PARTITION" \
  --job-name="$JOB_NAME" \
  --gres=gpu:"$GPUS_PER_NODE" \
  --ntasks="$GPUS" \
  --ntasks-per-node="$GPUS_PER_NODE" \
  --cpus-per-task="$CPUS_PER_TASK" \
  --kill-on-bad-exit=1 \
  "${EXTRA_SRUN[@]}" \
  "${PYTHON:-python}" -u "$(dirname "$0")/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm \
  "${@:5}"
