#!/usr/bin/env bash
# The wheels of the GPU check (benchmarks/gpu_check.py), for Python 3.12 on x86-64 Linux, into
# .gpu_wheels/ (git ignores it):
#   carry/    what travels to the GPU machine (requirements/gpu_carry.txt, without dependencies:
#             every need is listed); about 11 MB, well inside a device call's 64 MiB;
#   machine/  what that machine already holds (requirements/gpu_machine.txt, with dependencies;
#             torch is PyPI's CUDA 13 build, about 2.6 GB): the rehearsal's environment
#             (tests/test_gpu_check.py), not carried.
#     bash tools/fetch_gpu_wheels.sh          (make gpu-wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${NALA_GPU_WHEELS:-.gpu_wheels}
PLATFORMS=()
for tag in manylinux_2_{5,12,17,18,24,25,27,28,34}_x86_64 manylinux2014_x86_64 \
           manylinux2010_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done
download() {
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" "$@" 2>&1 | grep -v '^WARNING: Location' || true
}
mkdir -p "$DEST/carry" "$DEST/machine"
download --no-deps -d "$DEST/carry" -r requirements/gpu_carry.txt
download -d "$DEST/machine" -r requirements/gpu_machine.txt
for dir in carry machine; do
  echo "[gpu-wheels] $DEST/$dir: $(ls "$DEST/$dir" | wc -l) wheels, $(du -sh "$DEST/$dir" | cut -f1)"
done
