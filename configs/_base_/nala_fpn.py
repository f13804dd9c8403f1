# Semantic FPN + NaLaFormer-T on ADE20K, 512x512, 80k iterations, 4 GPUs x 4 images.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py', './models/nalaformer-t.py',
    'mmseg::_base_/datasets/ade20k.py', 'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py', './nala_runtime.py'
]
# nala_mm registers the models and changes nothing else; the project's tools add the host
# changes they rely on (resume under the upstream train.py: docs/user_guides/robustness.md).
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        _base_.nalaformer_t,
        norm_cfg=dict(type='SyncBN', requires_grad=True)),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=256, num_outs=4),
    decode_head=dict(num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4),
    paramwise_cfg={{_base_.nala_no_decay}})
param_scheduler = [dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=80000, by_epoch=False)]
# 4 GPUs x 4 images = 16 images per iteration: the batch the learning rate is set for
# (tools/train.py --auto-scale-lr scales it to another total batch)
train_dataloader = dict(batch_size=4)
auto_scale_lr = dict(enable=False, base_batch_size=16)
