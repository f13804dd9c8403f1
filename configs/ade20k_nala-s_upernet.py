# NaLaFormer-S + UperNet, ADE20K 512x512, 160k (head widths follow the variant's channels).
_base_ = ['./_base_/nala_upernet.py']
model = dict(
    backbone=dict(arch='s'),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
