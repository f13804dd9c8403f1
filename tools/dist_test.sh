#!/usr/bin/env bash
# Multi-process testing through torchrun and mmengine's launcher (gloo on CPU, nccl on GPU).
#   tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py options]
# PYTHON selects the interpreter (default: python3 on the PATH, e.g. the activated .venv).
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PYTHONPATH="$(dirname "$0")/..:${PYTHONPATH:-}" \
"${PYTHON:-python3}" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --nproc_per_node="$NPROC" --master_port="$PORT" \
  "$(dirname "$0")/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
