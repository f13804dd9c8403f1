# As ade20k_swin-t_upernet_nala-s12.py with NaLa in all four stages: no window attention left.
_base_ = ['./ade20k_swin-t_upernet_nala-s12.py']
model = dict(backbone=dict(mixers=('nala', 'nala', 'nala', 'nala')))
