# NaLaFormer-B + Mask R-CNN, COCO 1x, from the authors' ImageNet weights (FPN inputs follow
# the variant's channels).
_base_ = ['./_base_/nala_mask-rcnn_1x.py', './_base_/nala_pretrained.py']
model = dict(backbone=dict(arch='b', init_cfg=dict(
                 type='Pretrained', checkpoint={{_base_.nala_checkpoints.b}})),
             neck=dict(in_channels=[96, 192, 384, 512]))
