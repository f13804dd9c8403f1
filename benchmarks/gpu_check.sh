#!/usr/bin/env bash
# GPU readiness in one go, from the repository root of an environment set up for CUDA (README:
# FORCE_CUDA=1 and a CUDA torch): mmcv's CUDA ops (tools/check_env.py); the device-parametrised
# parity tests on CUDA (make test-cuda: float64 formulas, fast vs reference, fp16 autocast); the
# speed benchmarks with --device cuda (benchmarks/results/speed/*_cuda.*); whole-model inference
# through tools/benchmark.py, fp32 and fp16, NaLa against Swin-T in turns
# (benchmarks/results/tools/inference_*_cuda.json); a 50-iteration AMP training run of the demo
# segmentor; attention transfer (tools/linearize.py) on CUDA; and torch.compile through Triton
# (benchmarks/speed/compile.py, and tools/benchmark.py --compile under fp16 autocast).
#
#     bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python
TOOLS_OUT=benchmarks/results/tools
mkdir -p "$TOOLS_OUT" work_dirs
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh needs a CUDA device')"

echo "== mmcv's NMS and RoIAlign on CUDA tensors"
$PY tools/check_env.py

echo '== parity on CUDA: the device-parametrised tests (make test-cuda)'
$PY -m pytest tests -q -p no:cacheprovider -m cuda

echo '== speed benchmarks on CUDA'
$PY -m benchmarks.speed.attention --device cuda --sizes 64 128 256
$PY -m benchmarks.speed.backbone --device cuda --sizes 1024 2048 --train-sizes 512 1024 --repeats 10 --warmup 3
$PY -m benchmarks.speed.segmentor --device cuda --sizes 1024 2048 --train-sizes 512 --repeats 10 --warmup 3
$PY -m benchmarks.speed.swap --device cuda --sizes 1024 2048 --repeats 10 --warmup 3
$PY -m benchmarks.speed.vit --device cuda
$PY -m benchmarks.speed.vitdet --device cuda --repeats 10 --warmup 3
$PY -m benchmarks.speed.amp --device cuda

echo '== torch.compile on CUDA: Triton through inductor (the compiled tests ran above with -m cuda)'
$PY -m benchmarks.speed.compile --device cuda --parts layer --layer-sides 128 256 --repeats 10 --warmup 3
$PY -m benchmarks.speed.compile --device cuda --parts backbone vit upernet --repeats 10 --warmup 3

echo '== whole-model inference (tools/benchmark.py): UperNet + all-linear NaLaFormer-T vs Swin-T'
SWIN=mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py
for SIZE in 512 2048; do
  $PY tools/benchmark.py configs/ade20k_nala-t-linear_upernet.py --shape $SIZE $SIZE --device cuda \
      --warmup 5 --repeat 20 --compare $SWIN --out "$TOOLS_OUT/inference_${SIZE}_cuda.json"
  $PY tools/benchmark.py configs/ade20k_nala-t-linear_upernet.py --shape $SIZE $SIZE --device cuda \
      --amp --warmup 5 --repeat 20 --compare $SWIN --out "$TOOLS_OUT/inference_${SIZE}_fp16_cuda.json"
  $PY tools/benchmark.py configs/ade20k_nala-t-linear_upernet.py --shape $SIZE $SIZE --device cuda \
      --compile --amp --warmup 5 --repeat 20 --compare $SWIN \
      --out "$TOOLS_OUT/inference_${SIZE}_fp16_compiled_cuda.json"
done

echo '== 50-iteration AMP training run of the demo segmentor'
$PY -m nala_mm.datasets.demo seg
$PY tools/train.py configs/demo/ade20k_demo_nala_upernet.py --amp --work-dir work_dirs/gpu_check_amp \
    --cfg-options train_cfg.max_iters=50 train_cfg.val_interval=50 default_hooks.checkpoint.interval=50

echo '== attention transfer on CUDA: the long-range ViT, stock -> NaLa (tools/linearize.py)'
$PY -m nala_mm.datasets.longrange --num-train 32 --num-val 8
# the stock teacher: 20 iterations of the stock ViT config
$PY tools/train.py configs/longrange/ade20k_longrange_vit.py --work-dir work_dirs/gpu_check_vit \
    --cfg-options train_cfg.max_iters=20 train_cfg.val_interval=20 default_hooks.checkpoint.interval=20
$PY tools/linearize.py configs/longrange/ade20k_longrange_vit_nala.py \
    work_dirs/gpu_check_vit/iter_20.pth --out work_dirs/gpu_check_vit_linearized.pth --iters 50 \
    --device cuda --report "$TOOLS_OUT/linearize_cuda.json"
echo "results: benchmarks/results/speed/*_cuda.* and $TOOLS_OUT/*_cuda.json"
