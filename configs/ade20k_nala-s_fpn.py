# NaLaFormer-S + Semantic FPN, ADE20K 512x512, 80k, from the authors' ImageNet weights.
_base_ = ['./_base_/nala_fpn.py', './_base_/nala_pretrained.py']
model = dict(backbone=dict(arch='s', init_cfg=dict(
                 type='Pretrained', checkpoint={{_base_.nala_checkpoints.s}})),
             neck=dict(in_channels=[64, 128, 320, 512]))
