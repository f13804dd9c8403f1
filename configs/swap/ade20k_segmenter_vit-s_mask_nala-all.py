# mmseg's Segmenter ViT-S (mask transformer head) on ADE20K (160k, 512x512) with NaLa in all 12
# layers of the backbone (why all: docs/user_guides/vit.md). Only the backbone type and `mixers`
# change: the
# stock recipe trains without weight decay, so the mixers' new parameters need nothing more. The
# mask transformer head keeps its own softmax layers over the patches and class embeddings.
_base_ = ['mmseg::segmenter/segmenter_vit-s_mask_8xb1-160k_ade20k-512x512.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='NaLaVisionTransformer', mixers=('nala',) * 12))
# the stock recipe's batch (8 GPUs x 1 image), for tools/train.py --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=8)
