#!/usr/bin/env bash
# Training on a slurm cluster: one task per GPU through srun, mmengine's slurm launcher.
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS="..."] \
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]
# GPUS: tasks in all (GPUS / GPUS_PER_NODE nodes); SRUN_ARGS: more srun options (e.g.
# "--quotatype=auto"); PYTHON selects the interpreter (default: python on the PATH).
# The total batch is GPUS x train_dataloader.batch_size; add --auto-scale-lr when it differs
# from the config's auto_scale_lr.base_batch_size.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
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
  "${PYTHON:-python}" -u "$(dirname "$0")/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
  --launcher=slurm "${@:5}"
