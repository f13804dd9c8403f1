# NaLaFormer-B + Semantic FPN, ADE20K 512x512, 80k.
_base_ = ['./_base_/nala_fpn.py']
model = dict(backbone=dict(arch='b'), neck=dict(in_channels=[96, 192, 384, 512]))
