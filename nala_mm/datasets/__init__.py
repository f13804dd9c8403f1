"""Synthetic data in the exact ADE20K and COCO layouts (the demos', and :mod:`.longrange`'s
long-range exemplar task), and the data checks the project's tools
run (:mod:`.checks`)."""
