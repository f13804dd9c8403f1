# NaLaFormer-B + UperNet, ADE20K 512x512, 160k, from the authors' ImageNet weights (head
# widths follow the variant's channels).
_base_ = ['./_base_/nala_upernet.py', './_base_/nala_pretrained.py']
model = dict(
    backbone=dict(arch='b',
                  init_cfg=dict(type='Pretrained', checkpoint={{_base_.nala_checkpoints.b}})),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
    auxiliary_head=dict(in_channels=384))
