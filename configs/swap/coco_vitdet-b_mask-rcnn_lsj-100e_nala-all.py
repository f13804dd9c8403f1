# ViTDet-B with NaLa in every block: global reach in all twelve, at linear cost in the tokens
# (docs/user_guides/vitdet.md). Everything else is the stock-layout config's; the same ViT-B
# checkpoint
# carries each block's q/k/v and output projection into its NaLa mixer (gate rows, LePE and the
# mixer's LayerNorm start as initialised).
_base_ = ['./coco_vitdet-b_mask-rcnn_lsj-100e.py']

model = dict(backbone=dict(mixers=['nala'] * 12))
