"""Synthetic data in the exact ADE20K and COCO layouts (the demos', and :mod:`.longrange`'s
long-range exemplar task), and the data checks that :mod:`nala_mm.compat` installs on the
upstream dataset classes."""
