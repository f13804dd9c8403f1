# mmdet's RetinaNet PVTv2-B0 1x on COCO with NaLa in stages 1-2, at full resolution where PVTv2
# reduces keys/values; the official PVTv2-B0 weights (mmdet's pvt_convert) carry over.
# The stock recipe decays every parameter; the mixers' LayerNorm is exempted as everywhere else.
_base_ = ['mmdet::pvt/retinanet_pvtv2-b0_fpn_1x_coco.py']
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

model = dict(backbone=dict(type='NaLaPyramidVisionTransformerV2',
                           mixers=('nala', 'nala', 'softmax', 'softmax')))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys={'mixer.ln': dict(decay_mult=0.)}))
# the stock recipe's batch (8 GPUs x 2 images), for tools/train.py --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
