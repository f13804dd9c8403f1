"""Prove the environment is usable: versions, and mmcv's compiled ops really run.

On a machine with CUDA, mmcv's NMS and RoIAlign also run on CUDA tensors and must agree with the
CPU results: an mmcv built without its CUDA kernels (no ``FORCE_CUDA=1``, or no CUDA toolkit at
build time) imports fine and fails only there. Exit code 0 when all is well; otherwise a message
that says what is wrong and how to fix it.
"""
import sys

REBUILD_CUDA = ('rebuild it with its CUDA kernels: `pip uninstall -y mmcv && pip cache remove '
                'mmcv`, then `FORCE_CUDA=1 make setup` with a CUDA toolkit matching torch\'s CUDA '
                '{cuda} on the PATH (nvcc --version); in an environment of your own: '
                '`FORCE_CUDA=1 MMCV_WITH_OPS=1 pip install --no-build-isolation mmcv==2.1.0`')


def fail(message: str) -> None:
    print(f'[check_env] ERROR: {message}', file=sys.stderr)
    sys.exit(1)


def check_cuda_ops(boxes, scores, keep, feats, rois, pooled) -> str:
    """NMS and RoIAlign on CUDA tensors, compared with their CPU results; the GPU's name."""
    import torch
    from mmcv.ops import RoIAlign, get_compiling_cuda_version, nms
    cuda = torch.version.cuda
    built_for = get_compiling_cuda_version()
    if built_for == 'not available':
        fail(f'mmcv was built without CUDA ops although CUDA {cuda} is available; '
             + REBUILD_CUDA.format(cuda=cuda))
    try:
        _, keep_cuda = nms(boxes.cuda(), scores.cuda(), iou_threshold=0.5)
        pooled_cuda = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2,
                               aligned=False)(feats.cuda(), rois.cuda())
        torch.cuda.synchronize()
    except (RuntimeError, AssertionError) as err:
        fail(f'mmcv\'s ops failed on CUDA tensors ({err}); mmcv was built for CUDA {built_for}, '
             f'torch uses CUDA {cuda}: ' + REBUILD_CUDA.format(cuda=cuda))
    if keep_cuda.cpu().tolist() != keep or not torch.allclose(pooled_cuda.cpu(), pooled,
                                                               atol=1e-5):
        fail(f'mmcv\'s CUDA ops disagree with the CPU ones (nms kept {keep_cuda.cpu().tolist()}, '
             f'expected {keep}); ' + REBUILD_CUDA.format(cuda=cuda))
    return torch.cuda.get_device_name()


def check_pretrain() -> str:
    """mmpretrain (configs/imagenet) and the torchvision it imports without declaring it; a
    warning, not a failure, when its models do not import: segmentation and detection do not
    need them."""
    try:
        import mmpretrain
    except ImportError:
        return 'no mmpretrain (pretraining configs unavailable: pip install nala-mm[pretrain])'
    try:
        import mmpretrain.models  # noqa: F401
        import torchvision
    except Exception as err:  # ImportError; RuntimeError from a torchvision built for another torch
        import torch
        print(f'[check_env] WARNING: mmpretrain {mmpretrain.__version__} is installed but its '
              f'models do not import ({type(err).__name__}: {err}). They need the torchvision '
              f'built for torch {torch.__version__}: `pip install --no-deps '
              "torchvision==<its version>` from torch's index for your build "
              '(https://download.pytorch.org/whl/cpu for a CPU torch). Segmentation and '
              'detection are unaffected.', file=sys.stderr)
        return f'mmpretrain {mmpretrain.__version__} (models unavailable: no usable torchvision)'
    return f'mmpretrain {mmpretrain.__version__} with torchvision {torchvision.__version__}'


def main() -> None:
    try:
        import mmcv
        import torch
    except ImportError as err:
        fail(f'{err}. Run `make setup` (or tools/setup_env.sh).')
    if mmcv.__version__ != '2.1.0':
        fail(f'mmcv {mmcv.__version__} is installed; mmseg 1.2.2 and mmdet 3.3.0 need mmcv 2.1.0. '
             'Run `make setup` after `pip uninstall mmcv`.')
    try:
        from mmcv.ops import RoIAlign, nms
    except (ImportError, OSError) as err:
        fail(f'mmcv has no compiled ops ({err}). It was built without MMCV_WITH_OPS=1: run '
             '`pip uninstall -y mmcv && pip cache remove mmcv` then `make setup`.')
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    _, keep = nms(boxes, scores, iou_threshold=0.5)
    if keep.tolist() != [0, 2]:
        fail(f'mmcv.ops.nms returned {keep.tolist()} for a known case (expected [0, 2])')
    feats = torch.arange(16.).reshape(1, 1, 4, 4)
    rois = torch.tensor([[0., 0., 0., 3., 3.]])
    pooled = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=False)(feats, rois)
    if pooled.shape != (1, 1, 2, 2) or not torch.isfinite(pooled).all():
        fail(f'mmcv.ops.RoIAlign gave {tuple(pooled.shape)}')
    if torch.cuda.is_available():
        check_cuda_ops(boxes, scores, keep.tolist(), feats, rois, pooled)
    try:
        import pkg_resources  # noqa: F401  (mmseg:: / mmdet:: config inheritance needs it)
    except ImportError:
        fail('setuptools >= 82 has no pkg_resources, which `mmseg::` base configs need: '
             'pip install "setuptools>=77,<82"')
    import mmdet
    import mmengine
    import mmseg

    from nala_mm import compat  # (registers the modules)
    with compat.installed():  # the host changes the tools make apply to these versions
        pass
    pretrain = check_pretrain()
    device = f'CUDA ops on {torch.cuda.get_device_name()}' if torch.cuda.is_available() else \
        'no CUDA device: CPU ops only'
    print(f'[check_env] ok: torch {torch.__version__}, mmcv {mmcv.__version__} (ops: nms, '
          f'RoIAlign; {device}), mmengine {mmengine.__version__}, mmseg {mmseg.__version__}, '
          f'mmdet {mmdet.__version__}, {pretrain}')


if __name__ == '__main__':
    main()
