#!/usr/bin/env bash
# Multi-process training through torchrun and mmengine's launcher (gloo on CPU, nccl on GPU).
#   tools/dist_train.sh CONFIG NUM_PROCS [train.py options]
# PYTHON selects the interpreter (default: python3 on the PATH, e.g. the activated .venv).
set -euo pipefail
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PYTHONPATH="$(dirname "$0")/..:${PYTHONPATH:-}" \
"${PYTHON:-python3}" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --nproc_per_node="$NPROC" --master_port="$PORT" \
  "$(dirname "$0")/train.py" "$CONFIG" --launcher pytorch "${@:3}"
