# NaLaFormer-T with NaLa in all four stages: cost stays linear in pixels at high resolution.
_base_ = ['./ade20k_nala_upernet.py']
model = dict(backbone=dict(attn_types=('nala', 'nala', 'nala', 'nala')))
