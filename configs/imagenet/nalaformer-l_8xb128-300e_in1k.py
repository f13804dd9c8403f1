# NaLaFormer-L on ImageNet-1K: the authors' recipe of nalaformer-t_8xb128-300e_in1k.py
# (every item explained there) with the L variant, whose widths, depths, heads, LayerScale
# and drop path come from nala_mm's ARCH_SETTINGS; the tail reads its 640-wide last stage.
_base_ = ['./nalaformer-t_8xb128-300e_in1k.py']
model = dict(backbone=dict(arch='l'), neck=dict(in_channels=640))
