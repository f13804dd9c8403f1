#!/usr/bin/env bash
# GPU readiness in one go: mmcv's CUDA ops (tools/check_env.py), the chunked op against the
# written-out formulas (float64), fast-vs-reference parity on CUDA in fp32 and under fp16
# autocast, the attention / backbone / segmentor / swapped-backbone / ViT benchmarks with
# --device cuda, whole-model inference through tools/benchmark.py (fp32 and fp16, NaLa against
# Swin-T in turns), a 50-iteration AMP training run of the demo segmentor, and attention
# transfer (tools/linearize.py) on CUDA.
# Results: benchmarks/results/*_cuda.*
#
#     bash benchmarks/gpu_check.sh            # from the repository root, environment set up
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python
OUT=benchmarks/results
mkdir -p "$OUT"
$PY - <<'PYCODE'
import torch
assert torch.cuda.is_available(), 'gpu_check.sh needs a CUDA device'
print(torch.cuda.get_device_name(), 'torch', torch.__version__)
PYCODE

echo "== mmcv's NMS and RoIAlign on CUDA tensors"
$PY tools/check_env.py

echo '== parity on CUDA: fast vs reference (fp32), and fp16 autocast vs fp32'
$PY - <<'PYCODE' | tee "$OUT/parity_cuda.txt"
import json
import torch
from nala_mm.models import (LinearAttention, NaLaFormer, NormAwareLinearAttention,
                            SoftmaxAttention)

def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())

torch.manual_seed(0)
results = {}
for kernel in ('relu', 'cosine'):
    fast = NormAwareLinearAttention(64, 2, kernel=kernel).cuda()
    ref = NormAwareLinearAttention(64, 2, kernel=kernel, mode='reference').cuda()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 48, 40, 64, device='cuda')
    out_fast, out_ref = fast(x), ref(x)
    out_fast.square().sum().backward()
    out_ref.square().sum().backward()
    grads = max(rel(a.grad, b.grad) for a, b in zip(fast.parameters(), ref.parameters()))
    results[f'nala_{kernel}_fp32'] = dict(out=rel(out_fast, out_ref), grads=grads)
    assert results[f'nala_{kernel}_fp32']['out'] < 1e-4 and grads < 1e-4, results
for cls in (NormAwareLinearAttention, LinearAttention, SoftmaxAttention):
    layer = cls(64, 2).cuda().eval()
    x = torch.randn(1, 64, 64, 64, device='cuda')
    with torch.no_grad():
        expected = layer(x)
        with torch.autocast('cuda', dtype=torch.float16):
            actual = layer(x)
    results[f'{cls.__name__}_fp16_autocast'] = dict(out=rel(actual, expected),
                                                     finite=bool(torch.isfinite(actual).all()))
    assert results[f'{cls.__name__}_fp16_autocast']['finite'], results
    assert results[f'{cls.__name__}_fp16_autocast']['out'] < 1e-2, results
nala = dict(type='NormAwareLinearAttention', kernel='relu')
model = NaLaFormer(arch='t', mixers=(nala,) * 4).cuda().eval()
with torch.no_grad():
    image = torch.randn(1, 3, 512, 512, device='cuda')
    expected = model(image)
    with torch.autocast('cuda', dtype=torch.float16):
        actual = model(image)
results['backbone_fp16_autocast'] = [rel(a, e) for a, e in zip(actual, expected)]
print(json.dumps(results, indent=2))
PYCODE

echo '== the chunked op on the device against the formulas written out (tests/reference), float64'
$PY - <<'PYCODE' | tee "$OUT/formulas_cuda.txt"
import json
import os
import torch
from nala_mm.ops import NaLaConfig, nala_attention
from tests.reference import formulas

device = os.environ.get('GPU_CHECK_DEVICE', 'cuda')
height, width, dims = 5, 7, 8
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 2, height * width, dims, generator=gen, dtype=torch.float64)
           for _ in range(3))
rope = formulas.rope_tables(height, width, dims)
errors = {}
for kernel in ('cosine', 'relu'):
    want = formulas.nala(q, k, v, kernel, rope=rope)
    for mode in ('fast', 'reference'):
        got = nala_attention(*(t.to(device) for t in (q, k, v)), NaLaConfig(kernel=kernel),
                             tuple(t.to(device) for t in rope), mode, chunk=8).cpu()
        errors[f'{kernel}_{mode}'] = float((got - want).abs().max() / want.abs().max())
print(json.dumps(errors, indent=2))
assert max(errors.values()) < 1e-6, errors
PYCODE

echo '== benchmarks'
$PY benchmarks/attention.py --device cuda --sizes 64 128 256
$PY benchmarks/backbone.py --device cuda --sizes 1024 2048 --train-sizes 512 1024 --repeats 10 --warmup 3
$PY benchmarks/segmentor.py --device cuda --sizes 1024 2048 --train-sizes 512 --repeats 10 --warmup 3
# stock Swin-T / MiT-B0 / PVTv2-B0 against their NaLa-swapped versions (docs/swap.md)
$PY benchmarks/swap.py --device cuda --sizes 1024 2048 --repeats 10 --warmup 3
# ViT-S/B stock, fused SDPA and NaLa (writes vit_cuda.json/.md/.png)
$PY benchmarks/vit.py --device cuda

echo '== whole-model inference (tools/benchmark.py): UperNet + all-linear NaLaFormer-T vs Swin-T'
SWIN=mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py
for SIZE in 512 2048; do
  $PY tools/benchmark.py configs/ade20k_nala-t-linear_upernet.py --shape $SIZE $SIZE --device cuda \
      --warmup 5 --repeat 20 --compare $SWIN --out "$OUT/inference_${SIZE}_cuda.json"
  $PY tools/benchmark.py configs/ade20k_nala-t-linear_upernet.py --shape $SIZE $SIZE --device cuda \
      --amp --warmup 5 --repeat 20 --compare $SWIN --out "$OUT/inference_${SIZE}_fp16_cuda.json"
done

echo '== 50-iteration AMP training run of the demo segmentor'
$PY -c "from nala_mm.datasets.synthetic_ade import generate_ade_like; generate_ade_like('data/demo/ade/ADEChallengeData2016')"
$PY tools/train.py configs/demo/ade20k_demo_nala_upernet.py --amp --work-dir work_dirs/gpu_check_amp \
    --cfg-options train_cfg.max_iters=50 train_cfg.val_interval=50 \
    default_hooks.checkpoint.interval=50 2>&1 | tee "$OUT/amp_train_cuda.log" | grep -E "Iter|mIoU" | tail -5
echo '== attention transfer on CUDA: the long-range ViT, stock -> NaLa (tools/linearize.py)'
mkdir -p work_dirs
$PY -m nala_mm.datasets.longrange --num-train 32 --num-val 8
$PY - <<'PYCODE'
import torch
from nala_mm.config_loading import build_model_from_config
model, _ = build_model_from_config('configs/longrange/ade20k_longrange_vit.py')
model.init_weights()
torch.save({'state_dict': model.state_dict()}, 'work_dirs/gpu_check_vit_stock.pth')
PYCODE
$PY tools/linearize.py configs/longrange/ade20k_longrange_vit_nala.py \
    work_dirs/gpu_check_vit_stock.pth --out work_dirs/gpu_check_vit_linearized.pth --iters 50 \
    --device cuda --report "$OUT/linearize_cuda.json" 2>&1 | tail -4
echo "results: $OUT/*_cuda.*"
