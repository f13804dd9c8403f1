#!/usr/bin/env bash
# One-command environment for nala-mm: a .venv with the pinned OpenMMLab stack and an mmcv
# that really has its compiled ops. Idempotent: a second run only verifies.
#
# The versions are requirements/tested.txt's.
#   NALA_TORCH   pip requirement(s) for torch (default: the tested pin, the CPU build here).
#                GPU users: NALA_TORCH="torch==<tested> --index-url https://download.pytorch.org/whl/cu126"
#                (torchvision, for mmpretrain, comes from the same index: the build for that torch)
#   FORCE_CUDA   1: build mmcv's CUDA kernels (needs a CUDA toolkit matching torch on the PATH);
#                an installed mmcv without them is rebuilt
#   NALA_VENV    where the environment lives (default .venv)
#   PYTHON       interpreter used to create it (default python3)
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=${NALA_VENV:-.venv}
# the tested pin of a package, e.g. `pin mmcv` -> mmcv==2.1.0
pin() { grep -E "^$1==" requirements/tested.txt; }
TORCH_SPEC=${NALA_TORCH:-$(pin torch)}
PY=${PYTHON:-python3}
STAMP="$VENV/.nala-setup-done"
# The stamp records what was installed; a changed spec or setup.py triggers a refresh.
WANT="torch=[$TORCH_SPEC] cuda=${FORCE_CUDA:-0} setup=$(sha1sum setup.py tools/setup_env.sh requirements/tested.txt | sha1sum | cut -c1-12)"

log() { printf '[setup] %s\n' "$*"; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  "$VENV/bin/python" tools/check_env.py && exit 0
  log "environment at $VENV failed its check; reinstalling"
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1

log "installing torch ($TORCH_SPEC) and build tools"
# shellcheck disable=SC2086
$PIP install -q $TORCH_SPEC
# setuptools >= 82 drops pkg_resources: both the mmcv build and mmseg:: config inheritance need it.
$PIP install -q "setuptools>=77,<82" wheel ninja "numpy<2.3"

have_mmcv_ops() { "$VENV/bin/python" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '$(pin mmcv | cut -d= -f3)'" 2>/dev/null; }
# 'not available': the ops were compiled without CUDA kernels (a CPU build)
mmcv_cuda() { "$VENV/bin/python" -c "from mmcv.ops import get_compiling_cuda_version as v; print(v())" 2>/dev/null || true; }
if [ "${FORCE_CUDA:-0}" = 1 ] && have_mmcv_ops && [ "$(mmcv_cuda)" = "not available" ]; then
  log "FORCE_CUDA=1 but the installed mmcv has no CUDA ops: rebuilding it"
  "$VENV/bin/python" -m pip uninstall -y -q mmcv
  # pip's cache holds the CPU build under the same name: it would be reinstalled as it is
  "$VENV/bin/python" -m pip cache remove mmcv >/dev/null 2>&1 || true
fi
if ! have_mmcv_ops; then
  log "building $(pin mmcv) with compiled ops (10-20 minutes on 2 cores, once per machine;"
  log "pip caches the wheel afterwards). Build log: $VENV/mmcv-build.log"
  "$VENV/bin/python" -m pip uninstall -y -q mmcv mmcv-lite >/dev/null 2>&1 || true
  # Plain `pip install mmcv` silently builds without ops; MMCV_WITH_OPS=1 forces them.
  # --no-build-isolation builds against the torch installed above (the ops link to it).
  ( MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-2} $PIP install -v --no-build-isolation "$(pin mmcv)" \
      >"$VENV/mmcv-build.log" 2>&1; echo $? >"$VENV/mmcv-build.rc" ) &
  build=$!
  start=$(date +%s)
  while kill -0 "$build" 2>/dev/null; do
    sleep 30
    step=$(grep -o -E '\[[0-9]+/[0-9]+\]' "$VENV/mmcv-build.log" 2>/dev/null | tail -n 1 || true)
    log "mmcv build running for $(( ($(date +%s) - start) / 60 )) min ${step:+(compiling $step)}"
  done
  wait "$build" || true
  if [ "$(cat "$VENV/mmcv-build.rc")" != 0 ]; then
    tail -n 30 "$VENV/mmcv-build.log"
    log "ERROR: the mmcv build failed (see $VENV/mmcv-build.log). Needs gcc/g++ and the Python headers;"
    log "       on a GPU machine also FORCE_CUDA=1 and a CUDA toolkit matching torch."
    exit 1
  fi
fi

log "installing mmengine, mmsegmentation, mmdet and test tools"
$PIP install -q "$(pin mmengine)" "$(pin mmsegmentation)" "$(pin mmdet)" einops ftfy regex \
  pycocotools pytest hypothesis matplotlib tqdm onnx onnxruntime onnxscript "ruff==0.17.6" build
# openmim (for `mim train mmseg ...`) pulls openxlab, which pins setuptools 60; its runtime
# needs are listed explicitly instead.
$PIP install -q --no-deps openmim
$PIP install -q click colorama model-index tabulate pandas requests rich
# mmpretrain (configs/imagenet, make demo-cls) imports torchvision without declaring it, and a
# torchvision wheel is built for exactly one torch: pip's resolver picks the one pinned to the
# torch installed above (from NALA_TORCH's index, if it names one). It is tried in a scratch
# folder first and installed only if it imports: PyPI's Linux wheels are CUDA builds, which fail
# to import beside a CPU torch and would then break every `import mmdet.models` (mmdet imports
# mmpretrain when it is there).
log "installing mmpretrain and the torchvision built for this torch"
TORCH_VERSION=$("$VENV/bin/python" -c "import torch; print(torch.__version__.split('+')[0])")
TORCH_INDEX=$(printf '%s\n' "$TORCH_SPEC" | grep -o -E -- '--(extra-)?index-url[= ][^ ]+' || true)
scratch=$(mktemp -d)
# shellcheck disable=SC2086
$PIP install -q --dry-run --report "$scratch/report.json" torchvision "torch==$TORCH_VERSION" $TORCH_INDEX
TORCHVISION=$("$VENV/bin/python" -c "import json, sys; print(next(i['metadata']['version'] for i in json.load(open(sys.argv[1]))['install'] if i['metadata']['name'] == 'torchvision'))" "$scratch/report.json")
# shellcheck disable=SC2086
$PIP install -q --no-deps --target "$scratch/tv" "torchvision==$TORCHVISION" $TORCH_INDEX
if PYTHONPATH="$scratch/tv" "$VENV/bin/python" -c "import torchvision" 2>"$scratch/error"; then
  # shellcheck disable=SC2086
  $PIP install -q --no-deps "torchvision==$TORCHVISION" $TORCH_INDEX
  rm -rf "$VENV/torchvision-without-ops"
else
  log "WARNING: torchvision $TORCHVISION (the build pip finds for torch $TORCH_VERSION) does not import"
  log "  beside this torch ($(tail -n 1 "$scratch/error")): not installed. mmpretrain's models need it:"
  log "  install the build for this torch, e.g. for the CPU build of torch:"
  log "  $VENV/bin/pip install --no-deps torchvision==$TORCHVISION --index-url https://download.pytorch.org/whl/cpu"
  # kept outside the environment for the test run alone (tests/support/pretrain.py)
  log "  (kept in $VENV/torchvision-without-ops for the tests of the mmpretrain classifier)"
  rm -rf "$VENV/torchvision-without-ops"
  mv "$scratch/tv" "$VENV/torchvision-without-ops"
fi
rm -rf "$scratch"
# its modelindex requirement is an empty placeholder package (openmim's model-index provides the
# module); its other needs are listed
$PIP install -q --no-deps "$(pin mmpretrain)"
$PIP install -q mat4py importlib-metadata
# Re-pin last: some dependency resolutions above move setuptools.
$PIP install -q "setuptools>=77,<82"
# The checkout installed in place with its metadata beside it (setup.py's develop command), so
# that mim and mmengine find the package at <checkout>/nala_mm; it also links nala_mm/.mim/ to
# configs/, tools/ and model-index.yml. (A PEP 660 `pip install -e .` keeps the metadata in
# site-packages, where mim looks for a nala_mm folder that does not exist.)
"$VENV/bin/python" setup.py -q develop

"$VENV/bin/python" tools/check_env.py
echo "$WANT" >"$STAMP"
log "done: activate with 'source $VENV/bin/activate'"
