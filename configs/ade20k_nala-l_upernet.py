# NaLaFormer-L + UperNet, ADE20K 512x512, 160k (head widths follow the variant's channels).
_base_ = ['./_base_/nala_upernet.py']
model = dict(
    backbone=dict(arch='l'),
    decode_head=dict(in_channels=[96, 192, 448, 640]),
    auxiliary_head=dict(in_channels=448))
