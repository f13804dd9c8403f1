# The long-range exemplar task (projects/longrange/README.md) for a plain ViT: mmseg's stock
# VisionTransformer, patch 8 (a 16 x 16 grid at 128 x 128), with the class token, decoded by
# the task's 1x1-convolution head from its last layer, whose tokens are 8 px apart. The softmax
# teacher of the linearize study (benchmarks/studies/linearize.py, docs/user_guides/linearize.md);
# the same
# model with NaLa swapped in is ade20k_longrange_vit_nala.py. One layer: its attention is the only
# path from the exemplar to an object, since the patch embedding, the head and the upsampling of
# the logits reach less far than the 36 px between them.
_base_ = ['./ade20k_longrange_segformer.py']

model = dict(
    backbone=dict(
        _delete_=True, type='VisionTransformer', img_size=(128, 128), patch_size=8,
        in_channels=3, embed_dims=64, num_layers=1, num_heads=2, mlp_ratio=4, out_indices=(0,),
        with_cls_token=True, final_norm=True, norm_cfg=dict(type='LN', eps=1e-6),
        drop_rate=0.0, drop_path_rate=0.0, interpolate_mode='bicubic'),
    decode_head=dict(in_channels=[64]))
optim_wrapper = dict(optimizer=dict(lr=1e-3), paramwise_cfg=dict(custom_keys={
    'pos_embed': dict(decay_mult=0.), 'cls_token': dict(decay_mult=0.),
    'ln': dict(decay_mult=0.)}))
