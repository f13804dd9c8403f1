# NaLaFormer-T (hybrid: NaLa in stages 1-2, softmax in 3-4) + UperNet, ADE20K 512x512, 160k.
_base_ = ['./_base_/nala_upernet.py']
model = dict(backbone=dict(arch='t', init_cfg=None))
