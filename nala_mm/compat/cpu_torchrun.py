"""torchrun on a machine without CUDA: the launcher wrapper that :mod:`nala_mm.compat` installs."""
import torch
import torch.distributed as torch_dist


def cpu_aware_pytorch_launcher(original):
    """Wrap mmengine's torchrun initialiser, which calls ``torch.cuda.set_device``
    unconditionally (a CPU-only torch rejects it): without CUDA, initialise the (gloo) process
    group directly. Installed by :mod:`nala_mm.compat`."""

    def init_dist_pytorch(backend, init_backend='torch', **kwargs):
        if torch.cuda.is_available() or init_backend != 'torch':
            return original(backend, init_backend=init_backend, **kwargs)
        torch_dist.init_process_group(backend=backend, **kwargs)

    init_dist_pytorch.nala_cpu_aware = True
    return init_dist_pytorch
