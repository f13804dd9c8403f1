# UperNet + NaLaFormer-T on ADE20K, 512x512, 160k iterations, 8 GPUs x 2 images.
# Shared by every ade20k_nala*_upernet config: only the variant-specific widths differ there.
_base_ = [
    'mmseg::_base_/models/upernet_swin.py', './models/nalaformer-t.py',
    'mmseg::_base_/datasets/ade20k.py', 'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py', './nala_runtime.py'
]
# nala_mm registers the models and changes nothing else; the project's tools add the host
# changes they rely on (resume under the upstream train.py: docs/user_guides/robustness.md).
custom_imports = dict(imports=['nala_mm'], allow_failed_imports=False)

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(
        _base_.nalaformer_t,
        norm_cfg=dict(type='SyncBN', requires_grad=True)),
    decode_head=dict(in_channels=[64, 128, 256, 512], channels=512, num_classes=150),
    auxiliary_head=dict(in_channels=256, in_index=2, num_classes=150))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg={{_base_.nala_no_decay}})
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
# 8 GPUs x 2 images = 16 images per iteration: the batch the learning rate is set for
# (tools/train.py --auto-scale-lr scales it to another total batch)
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
