# The long-range exemplar task (projects/longrange/README.md; data: projects.longrange.data): an
# object's class says whether its colour matches an exemplar band at least 36 px away, so only
# token mixing can carry the answer. One token mixer in all four stages (NaLa's cosine kernel
# here; projects/longrange/study.py swaps it), decoded by mmseg's stock SegformerHead (1x1
# convolutions only, no global pooling) from the stride-4 features alone, with no auxiliary
# head: the convolutions on every path to a pixel's logits (the stem, the stage-1 block, the
# decoder's upsampling) reach 32 px, less than the exemplar's distance, so the control mixer
# that mixes no tokens cannot see the exemplar from any object, and the stage-1 mixer is the one
# that must find it. Stages 2-4 run but get no gradient. Sized for a 2-core CPU.
_base_ = ['../../../configs/demo/ade20k_demo_nala_upernet.py']

# the project's modules (MixerStatsHook, which its studies add to custom_hooks) import from the
# repository root: run from there with it on PYTHONPATH (as the studies' runs do)
custom_imports = dict(imports=['nala_mm', 'projects.longrange.training_stats'],
                      allow_failed_imports=False)

data_root = 'data/longrange/ade/ADEChallengeData2016'
metainfo = dict(classes=('wall', 'windowpane', 'painting'))
num_classes = 3
image_size = (128, 128)

model = dict(
    data_preprocessor=dict(size=image_size),
    backbone=dict(
        # one block per stage: each block's convolutions widen the receptive field (a second
        # stage-1 block would add 40 px); stages 2-4 are narrow because nothing decodes them
        arch=dict(_delete_=True, embed_dims=(32, 64, 64, 64), depths=(1, 1, 1, 1),
                  num_heads=(1, 2, 2, 2), mlp_ratios=(3, 3, 3, 3)),
        drop_path_rate=0.0,
        mixers=[dict(type='NormAwareLinearAttention', kernel='cosine')] * 4,
        out_indices=(0,)),
    decode_head=dict(
        _delete_=True, type='SegformerHead', in_channels=[32], in_index=[0], channels=64,
        dropout_ratio=0.1, num_classes=num_classes,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=None)

# no crop (it could cut the exemplar away) and no resize (distances are in pixels); a flip
# keeps the rule
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
# batch 4: at equal time, more updates found the matching sooner than batch 8 in calibration
train_dataloader = dict(
    batch_size=4,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader

auto_scale_lr = dict(enable=False, base_batch_size=4)  # one process x 4 images

max_iters = 1500
optim_wrapper = dict(optimizer=dict(lr=3e-3, weight_decay=0.01))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=150),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=150, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=100, log_metric_by_epoch=False),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1))
randomness = dict(seed=0)
