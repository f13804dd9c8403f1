# ade20k_longrange_vit.py with NaLa in its layer: the student of the linearize study, and, with
# dict(type='IdentityAttention') as the mixer, the control that mixes no tokens. (The base's
# 'ln' key already keeps weight decay off the mixer's LayerNorm.)
_base_ = ['./ade20k_longrange_vit.py']

model = dict(backbone=dict(type='NaLaVisionTransformer', mixers=('nala',)))
