"""Synthetic batches (nala_mm.apis.data_samples): what the benchmarks and tools feed a model."""
import pytest
import torch

from nala_mm.apis.data_samples import data_samples, synthetic_batch


def test_segmentation_batch_has_images_metadata_and_ground_truth_in_range():
    batch = synthetic_batch('mmseg', 2, 24, 40, num_classes=6, seed=3)
    assert [tuple(image.shape) for image in batch['inputs']] == [(3, 24, 40)] * 2
    assert all(image.dtype == torch.uint8 for image in batch['inputs'])
    sample = batch['data_samples'][1]
    assert sample.img_shape == sample.ori_shape == sample.pad_shape == (24, 40)
    labels = sample.gt_sem_seg.data
    assert tuple(labels.shape) == (1, 24, 40) and 0 <= labels.min() and labels.max() < 6
    again = synthetic_batch('mmseg', 2, 24, 40, seed=3)['inputs']
    assert all(torch.equal(a, b) for a, b in zip(batch['inputs'], again))  # the seed decides


def test_detection_samples_carry_the_batch_input_shape_and_refuse_random_ground_truth():
    sample, = data_samples('mmdet', 1, 32, 48)
    assert type(sample).__name__ == 'DetDataSample'
    assert sample.batch_input_shape == (32, 48) and sample.scale_factor == (1.0, 1.0)
    with pytest.raises(ValueError, match='segmentation only'):
        data_samples('mmdet', 1, 32, 48, num_classes=3)
    with pytest.raises(ValueError, match="'mmseg' or 'mmdet', got 'mmpretrain'"):
        data_samples('mmpretrain', 1, 32, 48)
