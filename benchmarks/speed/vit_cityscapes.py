"""Whole-image against sliding-window inference at Cityscapes' size (1024 x 2048) for SETR-Naive
ViT-L: NaLa in all 24 layers (configs/swap/cityscapes_setr_vit-l_naive_nala-all.py) both ways,
against the stock SETR both ways (the stock config slides 768 x 768 windows at stride 512, eight
windows of 2,305 tokens; the whole image is 8,193 tokens), and NaLa's SETR on a 4096 x 4096
image (65,537 tokens) with the 19 classes.

Each case runs in a fresh process: the segmentor built from its config with random weights (no
download), one batch-1 image, ``EncoderDecoder.inference`` in eval mode without gradients (what
``test.py`` runs, up to the logits at full resolution), one call timed and its peak memory
above the baseline taken (no warm-up call: every call takes minutes here, far more than one-time
allocations); a case predicted past the free memory is skipped and its prediction recorded
(:func:`benchmarks.lib.grid.run_grid`). Results: benchmarks/results/speed/vit_cityscapes.{json,md};
docs/user_guides/vit.md.

    python -m benchmarks.speed.vit_cityscapes
    python -m benchmarks.speed.vit_cityscapes --cases nala_whole nala_slide --out /tmp/x
"""
import os
import os.path as osp
from typing import Dict

import torch

from nala_mm.analysis.measure import (
    available_mib,
    device_name,
)

from ..lib import report
from ..lib.grid import grid_cli, run_grid
from ..lib.paths import REPO
from ..lib.provenance import code_version

NALA = osp.join(REPO, 'configs', 'swap', 'cityscapes_setr_vit-l_naive_nala-all.py')
STOCK = 'mmseg::setr/setr_vit-l_naive_8xb1-80k_cityscapes-768x768.py'
SLIDE = dict(mode='slide', crop_size=(768, 768), stride=(512, 512))
CASES: Dict[str, dict] = {
    'nala_whole': dict(label='NaLa SETR, whole image', config=NALA, test_cfg=dict(mode='whole'),
                       size=(1024, 2048)),
    'nala_slide': dict(label='NaLa SETR, 768² windows at stride 512', config=NALA,
                       test_cfg=SLIDE, size=(1024, 2048)),
    'stock_slide': dict(label='stock SETR, 768² windows at stride 512 (its config)',
                        config=STOCK, test_cfg=SLIDE, size=(1024, 2048)),
    'stock_whole': dict(label='stock SETR, whole image', config=STOCK,
                        test_cfg=dict(mode='whole'), size=(1024, 2048)),
    'nala_whole_4096': dict(label='NaLa SETR, whole 4096² image', config=NALA,
                            test_cfg=dict(mode='whole'), size=(4096, 4096)),
}
SAFETY_MIB = 2048


def step_of(name: str, case: dict):
    """The grid's child: one whole-image or sliding-window inference of case ``name``."""
    from nala_mm import compat
    from nala_mm.apis.config_loading import build_model_from_config
    compat.install()
    spec = CASES[name]
    options = {'model.pretrained': None, 'model.backbone.init_cfg': None,
               'model.test_cfg': spec['test_cfg']}
    model, _ = build_model_from_config(spec['config'], options)
    height, width = spec['size']
    image = torch.randn(1, 3, height, width)
    metas = [dict(ori_shape=(height, width), img_shape=(height, width),
                  pad_shape=(height, width), padding_size=[0, 0, 0, 0])]

    def step() -> None:
        with torch.no_grad():
            model.inference(image, metas)
    return step


def describe(name: str, settings: dict) -> dict:
    spec = CASES[name]
    slide = spec['test_cfg']['mode'] == 'slide'
    crop = (768, 768) if slide else spec['size']
    return dict(case=name, windows=windows(spec['size']) if slide else 1,
                tokens_per_pass=(crop[0] // 16) * (crop[1] // 16) + 1)


def predictor(budget_mib: float):
    """A stock case predicted past the free memory is skipped; every other case is one call."""
    def predict(rows, name: str, settings: dict) -> dict:
        row = dict(predicted_mib=predicted_mib(name) or None)
        if predicted_mib(name) > budget_mib:
            row['skipped'] = (f'predicted {predicted_mib(name) / 1024:.1f} GiB of peak memory, '
                              f'over the {budget_mib / 1024:.1f} GiB free')
        else:
            row['calls'] = 1
        return row
    return predict


def windows(size, crop=(768, 768), stride=(512, 512)) -> int:
    """How many windows mmseg's slide inference runs over an image of ``size``."""
    rows = max(size[0] - crop[0] + stride[0] - 1, 0) // stride[0] + 1
    cols = max(size[1] - crop[1] + stride[1] - 1, 0) // stride[1] + 1
    return rows * cols


def predicted_mib(name: str) -> float:
    """The stock model keeps, of one layer at a time, 16 heads' logits and softmax and the
    head-averaged weights, N x N float32 each (the rest is far smaller)."""
    spec = CASES[name]
    if not name.startswith('stock'):
        return 0.0
    crop = spec['size'] if spec['test_cfg']['mode'] == 'whole' else (768, 768)
    tokens = (crop[0] // 16) * (crop[1] // 16) + 1
    return (2 * 16 + 1) * tokens ** 2 * 4 / 2 ** 20


def write_outputs(saved: dict, stem: str) -> None:
    """``stem.json`` (``saved``, with the ratios) and the page ``stem.md``."""
    os.makedirs(osp.dirname(stem), exist_ok=True)
    rows = saved['rows']
    by = {r['case']: r for r in rows}
    reference = by.get('stock_slide', {})
    for row in rows:
        row['ms_vs_stock_slide'] = row['ms'] / reference['ms'] \
            if row.get('ms') and reference.get('ms') else None
        row['mib_vs_stock_slide'] = row['mib'] / reference['mib'] \
            if row.get('mib') and reference.get('mib') else None
    report.write_json(stem + '.json', saved)
    lines = [f"# SETR-Naive ViT-L: whole-image vs sliding-window inference ({saved['device']})",
             '', f"torch {saved['torch']}; one image, batch 1, random weights, "
             "`EncoderDecoder.inference` without gradients (logits at full resolution, 19 "
             f"classes); each case in its own process, {saved.get('warmup', 0)} warm-up call(s), "
             'then one call timed and its peak memory above the baseline taken.', '']
    lines += report.markdown_table(
        ['case', 'image', 'windows', 'tokens a pass', 'ms', 'peak MiB', 'time / stock slide',
         'memory / stock slide', 'note'],
        [[CASES[r['case']]['label'], 'x'.join(map(str, CASES[r['case']]['size'])),
          r['windows'], r['tokens_per_pass'], report.fmt(r.get('ms')), report.fmt(r.get('mib')),
          report.fmt(r.get('ms_vs_stock_slide'), 3), report.fmt(r.get('mib_vs_stock_slide'), 3),
          r.get('skipped') or r.get('error') or ''] for r in rows])
    report.write_markdown(stem + '.md', lines)


def main() -> None:
    parsed = grid_cli(__doc__, 'vit_cityscapes', step_of, write_outputs,
                      lambda parser: parser.add_argument('--cases', nargs='+', choices=list(CASES),
                                                         default=list(CASES)),
                      devices=False)  # the CPU's memory limit is what the cases are about
    if parsed is None:
        return
    args, stem = parsed
    budget = available_mib('cpu') - SAFETY_MIB
    saved = dict(commit=code_version(), device=device_name('cpu'), torch=torch.__version__,
                 warmup=0, rows=[])

    def save(rows):  # after each case: an interrupted run keeps what it measured
        write_outputs(dict(saved, rows=rows), stem)
    run_grid(__spec__.name, [(dict(), [name]) for name in args.cases], repeats=1, warmup=0,
             device='cpu', predict=predictor(budget), limit_mib=budget + 3072, describe=describe,
             after_case=save, desc='SETR')
    print(open(stem + '.md').read())


if __name__ == '__main__':
    main()
