"""Synthetic data in the exact ADE20K, COCO, Cityscapes and ImageNet layouts (the demos'; the
long-range exemplar task's generator, projects/longrange/data.py, builds on them), and the data
checks the project's tools run (:mod:`.checks`)."""
