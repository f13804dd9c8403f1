"""Synthetic data in the exact ADE20K and COCO layouts, and clear errors for missing data."""
from .checks import install_dataset_checks

install_dataset_checks()
