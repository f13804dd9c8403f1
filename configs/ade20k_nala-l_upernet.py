# NaLaFormer-L + UperNet, ADE20K 512x512, 160k, from the authors' ImageNet weights (head
# widths follow the variant's channels).
_base_ = ['./_base_/nala_upernet.py', './_base_/nala_pretrained.py']
model = dict(
    backbone=dict(arch='l',
                  init_cfg=dict(type='Pretrained', checkpoint={{_base_.nala_checkpoints.l}})),
    decode_head=dict(in_channels=[96, 192, 448, 640]),
    auxiliary_head=dict(in_channels=448))
