# mmseg's SETR-Naive ViT-L on Cityscapes (80k, 768x768 crops) with NaLa in all 24 layers (why
# all: docs/user_guides/vit.md). Only the backbone type, `mixers` and the test mode change: the
# stock recipe
# trains without weight decay, and nothing of the mixer is named 'head' (lr x10 stays on the
# heads). Inference runs on the whole 1024x2048 image instead of 768x768 windows at stride 512:
# with linear attention one pass over the 8,192 patches takes less than half the time of eight
# overlapping windows of 2,304, for somewhat more peak memory, and less of both than the stock
# model's windows (benchmarks/results/speed/vit_cityscapes.json, docs/user_guides/vit.md). Short of
# memory: set model.test_cfg back to the stock slide mode.
_base_ = ['mmseg::setr/setr_vit-l_naive_8xb1-80k_cityscapes-768x768.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='NaLaVisionTransformer', mixers=('nala',) * 24),
             test_cfg=dict(_delete_=True, mode='whole'))
# the stock recipe's batch (8 GPUs x 1 image), for tools/train.py --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=8)
