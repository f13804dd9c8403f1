# NaLaFormer-B + UperNet, ADE20K 512x512, 160k (head widths follow the variant's channels).
_base_ = ['./_base_/nala_upernet.py']
model = dict(
    backbone=dict(arch='b'),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
    auxiliary_head=dict(in_channels=384))
