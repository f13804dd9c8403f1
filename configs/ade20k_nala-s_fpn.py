# NaLaFormer-S + Semantic FPN, ADE20K 512x512, 80k.
_base_ = ['./_base_/nala_fpn.py']
model = dict(backbone=dict(arch='s'), neck=dict(in_channels=[64, 128, 320, 512]))
