"""Configs read as the upstream tools read them, and packaged configs found by their scope."""
import os.path as osp

from nala_mm.apis.config_loading import resolve_config_path


def test_resolve_config_path_finds_packaged_configs():
    path = resolve_config_path('mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_'
                               'ade20k-512x512.py')
    assert osp.isfile(path), path
    assert resolve_config_path('configs/x.py') == 'configs/x.py'
