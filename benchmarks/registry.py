"""Every benchmark and study, declared once: its name, the module that runs it, where it writes,
and what it measures. ``python -m benchmarks`` (:mod:`benchmarks.__main__`) lists and runs them;
a project declares its own in ``projects/NAME/benchmarks.py`` (a ``BENCHMARKS`` tuple), which the
registry finds."""
import glob
import importlib
import os.path as osp
from dataclasses import dataclass
from typing import Dict, Tuple

from .lib.paths import REPO, SPEED_RESULTS, STUDY_RESULTS


@dataclass(frozen=True)
class Benchmark:
    """``module`` runs it (``python -m MODULE [ARGS]``); it writes ``OUT/STEM.json`` and, for a
    report, ``OUT/STEM.md`` (+ a plot) for each of ``stems``, with ``OUT`` = ``results`` unless
    ``--out`` says otherwise; ``--report-only`` rewrites the pages from the JSON where
    ``report_only``. ``inputs``: what a report reads besides ``STEM.json`` (folders under
    ``results``)."""
    name: str
    module: str
    results: str
    stems: Tuple[str, ...]
    about: str
    report_only: bool = True
    inputs: Tuple[str, ...] = ()


def _speed(name: str, about: str, module: str = '') -> Benchmark:
    return Benchmark(name, module or f'benchmarks.speed.{name}', SPEED_RESULTS, (name,), about)


def _study(name: str, about: str, module: str = '', **kwargs) -> Benchmark:
    return Benchmark(name, module or f'benchmarks.studies.{name}', STUDY_RESULTS,
                     kwargs.pop('stems', (name,)), about, **kwargs)


CORE = (
    _speed('attention', 'NaLa attention against softmax (SDPA) by token count, forward and '
           'training step'),
    _speed('backbone', 'NaLaFormer-T (hybrid, all-linear, released mixers) against Swin-T'),
    _speed('segmentor', 'UperNet + NaLaFormer-T against UperNet + Swin-T'),
    _speed('swap', 'stock Swin-T, MiT-B0 and PVTv2-B0 against their NaLa-swapped versions'),
    _speed('vit', 'ViT-S/B stock, fused SDPA and NaLa at 512 to 4096 px'),
    _speed('vit_cityscapes', "SETR ViT-L whole against sliding-window inference at "
           "Cityscapes' size"),
    _speed('vitdet', 'ViTDet-B: windows, global softmax and NaLa; backbone + SimpleFPN and the '
           'whole Mask R-CNN'),
    _speed('compile', 'torch.compile: graphs over the sizes users meet; compiled against eager '
           'for the NaLa layer, its ops, NaLaFormer-T vs Swin-T and NaLa ViT vs fused SDPA'),
    _speed('amp', 'bf16 autocast against fp32, a training step of the demo segmentor'),
    _speed('conv_weight_grad', "the block's conv weight gradients: oneDNN against the "
           "package's node"),
    _speed('deploy', 'ONNX Runtime against PyTorch eager'),
    _study('ablation', 'token mixers at equal budget on the demo data: 5 variants x 3 seeds'),
    _study('out_norm_study', 'detection demo with and without the per-output LayerNorms, and a '
           'ResNet-18'),
    _study('swap_finetune', "a trained Swin's stages 1-2 swapped to NaLa and fine-tuned, "
           'against softmax continued'),
    _study('linearize', 'softmax-trained Swin and ViT converted to NaLa by a plain swap or by '
           'attention transfer, then fine-tuned'),
    _study('linearize_choices', "the attention transfer's design choices on the Swin teacher"),
    _study('linearize_iterations', "the ViT teacher's zero-shot mIoU against the transfer's "
           'iterations'),
    _study('linearize_vitdet', 'a tiny ViTDet into NaLa in every block: plain swap against 800 '
           'transfer iterations'),
    _study('demos', "both demos in full, their summaries stamped with the commit",
           stems=('demo_seg', 'demo_det', 'demo_cls'), report_only=False),
)


def _project_benchmarks() -> Tuple[Benchmark, ...]:
    found = []
    for path in sorted(glob.glob(osp.join(REPO, 'projects', '*', 'benchmarks.py'))):
        project = osp.basename(osp.dirname(path))
        found += importlib.import_module(f'projects.{project}.benchmarks').BENCHMARKS
    return tuple(found)


def registry() -> Dict[str, Benchmark]:
    """Name -> benchmark, the package's and every project's; a name declared twice raises."""
    table: Dict[str, Benchmark] = {}
    for bench in CORE + _project_benchmarks():
        if bench.name in table:
            raise KeyError(f'benchmark {bench.name!r} is declared by {table[bench.name].module} '
                           f'and by {bench.module}')
        table[bench.name] = bench
    return table
