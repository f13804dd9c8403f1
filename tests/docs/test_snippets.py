"""Every code block of README.md, docs/*.md and projects/*/README.md is executed by a test.

The convention
==============

Each fenced code block is classified by a marker, an HTML comment on the nearest non-blank line
before its opening fence (GitHub does not render it)::

    <!-- snippet: KIND -->
    ```python
    ...
    ```

KIND is one of:

``config on BASE``
    A Python config fragment meant to be put on the stock config ``BASE`` (``mmseg::...``,
    ``mmdet::...`` or a repository path such as ``configs/demo/...``). The test writes
    ``_base_ = ['BASE']`` above the block, builds the model and its optimizer, and runs one
    training step on a synthetic batch: the loss goes through every head (decode and auxiliary
    heads; RPN, box and mask heads), each head and the backbone get gradients, the optimizer
    steps. The step runs at 128x128 (the crop size is set to it): the wiring a snippet can break
    (channels, indices, registered names, optimizer keys) does not depend on the size.
``config``
    A whole config (it sets ``_base_`` itself); tested as above.
``backbone-args on BASE``
    Each line is one alternative ``name=value`` argument of ``model.backbone``; each is put on
    ``BASE`` and tested as above.
``python``
    Plain Python, executed in the test process (the registries are restored afterwards).
``python registers NAME``
    As ``python``; the block registers the token mixer ``NAME``, and a small NaLaFormer with it in
    all four stages then runs a forward and a backward pass, finite.
``shell``
    Bash, run with ``set -euo pipefail`` from a scratch folder laid out as the checkout (links to
    its ``configs/``, ``tools/``, ``benchmarks/`` and ``.venv/``), with small generated demo data
    in place under ``data/demo`` and the environment's ``bin/`` first on the PATH; every command
    must succeed. Placeholders have no place here: give real arguments, sized for seconds. These
    start processes, so they run under ``make test-extended``.
``usage``
    Synopsis lines (placeholders in capitals, ``[optional]`` parts, ``#`` comments, ``\\``
    continuations): each ``python SCRIPT`` / ``python -m MODULE`` / ``mim COMMAND`` line must
    answer ``--help`` and list every ``--option`` the line names; each ``tools/*.sh`` line names
    an executable script that ``bash -n`` accepts; each ``make TARGET`` names a target.
``skip (REASON)``
    Not executed; the reason is required (a layout, log output, a command that needs a GPU, a
    cluster or a real dataset).

A block without a marker, with an unknown kind, or a ``skip`` without a reason fails
``test_every_code_block_is_classified``; so does a code block indented by four spaces (write it
fenced, with a marker). Pages are found by globbing, so a new page is covered as it lands.
"""
import ast
import contextlib
import copy
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import torch

from tests.helpers import PYTHON, REPO, TINY_ARCH, tool_env

PAGES = ['README.md'] + sorted(str(p.relative_to(REPO)) for pages in (
    (REPO / 'docs').rglob('*.md'), (REPO / 'projects').glob('*/README.md')) for p in pages)
MARKER = re.compile(r'^<!--\s*snippet:\s*(?P<spec>.*?)\s*-->$')
KINDS = re.compile(r'^(?:config on (?P<config_base>\S+)|config|backbone-args on (?P<args_base>\S+)'
                   r'|python(?: registers (?P<mixer>\w+))?|shell|usage|skip \((?P<reason>.+)\))$')
DEMO_SEG = 'configs/demo/ade20k_demo_nala_upernet.py'
STEP_SIZE = (128, 128)


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    text: str
    spec: Optional[str]  # the marker's text after 'snippet:'
    problem: Optional[str] = None

    @property
    def id(self) -> str:
        return f'{self.page}:{self.line}'

    @property
    def kind(self) -> re.Match:
        return KINDS.match(self.spec or '')


def _list_context(lines: List[str], index: int) -> bool:
    """Whether the indented line ``index`` continues a list item (then it is not code)."""
    for previous in reversed(lines[:index]):
        if not previous.strip():
            continue
        return bool(re.match(r'\s*([-*+]|\d+\.)\s', previous)) or previous.startswith('  ')
    return False


def read_blocks(page: str) -> List[Block]:
    lines = (REPO / page).read_text(encoding='utf-8').splitlines()
    blocks, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith('```'):
            indent = len(line) - len(line.lstrip())
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith('```'):
                body.append(lines[i][indent:] if lines[i][:indent].strip() == '' else lines[i])
                i += 1
            text = '\n'.join(body)
            before = next((lines[j].strip() for j in range(start - 1, -1, -1)
                           if lines[j].strip()), '')
            marker = MARKER.match(before)
            block = Block(page, start + 1, text, marker.group('spec') if marker else None)
            if block.spec is None:
                block.problem = 'has no <!-- snippet: KIND --> marker before its fence'
            elif not block.kind:
                block.problem = f'has an unknown marker {block.spec!r}'
            blocks.append(block)
        elif line.startswith('    ') and line.strip() and i > 0 and not lines[i - 1].strip() \
                and not _list_context(lines, i - 1):
            blocks.append(Block(page, i + 1, line, None,
                                'is an indented code block: write it fenced, with a marker'))
        i += 1
    return blocks


ALL_BLOCKS = [b for page in PAGES for b in read_blocks(page)]


def blocks_of(*kinds: str) -> List[Block]:
    def kind_of(block):
        spec = block.spec or ''
        return spec.split(' ', 1)[0] if not spec.startswith('config on') else 'config'
    return [b for b in ALL_BLOCKS if b.problem is None and kind_of(b) in kinds]


def test_every_code_block_is_classified():
    problems = [f'{b.id} {b.problem}' for b in ALL_BLOCKS if b.problem]
    assert not problems, 'code blocks the tests cannot place:\n  ' + '\n  '.join(problems)


def test_the_pages_have_blocks_of_every_executed_kind():
    """The convention is in use (a parser that found nothing would pass everything)."""
    kinds = {(b.spec or '').split(' ')[0] for b in ALL_BLOCKS}
    assert {'config', 'python', 'shell', 'usage', 'skip'} <= kinds, kinds


# ------------------------------------------------------------------------------ configs
def _resolve_base(base: str) -> str:
    return base if '::' in base else str(REPO / base)


def config_texts(block: Block) -> List[str]:
    """The config file(s) a config-kind block stands for."""
    match = block.kind
    if match.group('config_base'):
        return [f"_base_ = [{_resolve_base(match.group('config_base'))!r}]\n{block.text}\n"]
    if match.group('args_base'):
        texts = []
        for line in filter(None, (raw.strip() for raw in block.text.splitlines())):
            ast.parse(f'dict({line})')  # a keyword argument, or a SyntaxError naming it
            texts.append(f"_base_ = [{_resolve_base(match.group('args_base'))!r}]\n"
                         f'model = dict(backbone=dict({line}))\n')
        return texts
    text = re.sub(r"(_base_\s*=\s*\[?\s*)'(configs/[^']+)'",
                  lambda m: f"{m.group(1)}{str(REPO / m.group(2))!r}", block.text)
    return [text + '\n']


def synthetic_batch(scope: str, cfg, size) -> dict:
    """Two random images with random ground truth, as a training pipeline packs them."""
    generator = torch.Generator().manual_seed(0)
    height, width = size
    inputs, samples = [], []
    for _ in range(2):
        inputs.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8,
                                    generator=generator))
        meta = dict(img_shape=size, ori_shape=size, pad_shape=size, scale_factor=(1.0, 1.0),
                    flip=False, flip_direction=None)
        if scope == 'mmseg':
            from mmengine.structures import PixelData
            from mmseg.structures import SegDataSample
            sample = SegDataSample(metainfo=meta)
            classes = cfg.model.decode_head.num_classes
            sample.gt_sem_seg = PixelData(data=torch.randint(
                0, classes, (1, height, width), generator=generator))
        else:
            from mmdet.structures import DetDataSample
            from mmdet.structures.mask import BitmapMasks
            from mmengine.structures import InstanceData
            sample = DetDataSample(metainfo=meta)
            boxes = torch.tensor([[8., 10., 70., 90.], [40., 30., 120., 110.]])
            masks = torch.zeros(2, height, width, dtype=torch.uint8)
            for k, (x0, y0, x1, y1) in enumerate(boxes.long().tolist()):
                masks[k, y0:y1, x0:x1] = 1
            sample.gt_instances = InstanceData(
                bboxes=boxes, labels=torch.tensor([0, 1]),
                masks=BitmapMasks(masks.numpy(), height, width))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


HEAD_LOSSES = {'decode_head': 'decode.', 'auxiliary_head': 'aux.', 'rpn_head': 'loss_rpn',
               'bbox_head': 'loss_cls'}


def one_training_step(config_file: str) -> dict:
    """Build the config's model and optimizer and run one training step on a synthetic batch;
    the logged losses. Asserts that every head's loss is there and finite and that the
    backbone and every head got gradients."""
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(config_file)
    scope = cfg.get('default_scope', 'mmseg')
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    if scope == 'mmseg':
        cfg.model.data_preprocessor.size = STEP_SIZE
    model = revert_sync_batchnorm(registry.build(cfg.model))
    model.train()
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    data = model.data_preprocessor(synthetic_batch(scope, cfg, STEP_SIZE), True)
    loss, log_vars = model.parse_losses(model(**data, mode='loss'))
    assert torch.isfinite(loss), log_vars
    heads = [name for name in ('backbone', 'neck', 'decode_head', 'auxiliary_head', 'rpn_head',
                               'roi_head', 'bbox_head') if getattr(model, name, None) is not None]
    for name in heads:
        prefix = HEAD_LOSSES.get(name)
        if prefix:
            assert any(k.startswith(prefix) for k in log_vars), f'no {prefix}* loss: {log_vars}'
    if 'roi_head' in heads:
        assert {'loss_cls', 'loss_bbox'} <= set(log_vars), log_vars
        if getattr(model.roi_head, 'with_mask', False):
            assert 'loss_mask' in log_vars, log_vars
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    loss.backward()
    for name in heads:
        grads = [p.grad for p in getattr(model, name).parameters() if p.requires_grad]
        assert any(g is not None and g.abs().sum() > 0 for g in grads), f'{name}: no gradient'
    wrapper.step()
    wrapper.zero_grad()
    moved = [n for n, p in model.named_parameters() if n in before and
             not torch.equal(p.detach(), before[n])]
    assert moved, 'the optimizer step changed no parameter'
    return log_vars


@pytest.mark.parametrize('block', blocks_of('config', 'backbone-args'), ids=lambda b: b.id)
def test_config_snippet_trains_one_step(block, tmp_path):
    for k, text in enumerate(config_texts(block)):
        path = tmp_path / f'snippet_{k}.py'
        path.write_text(text)
        log_vars = one_training_step(str(path))
        assert log_vars['loss'] > 0, (block.id, k, log_vars)


# ------------------------------------------------------------------------------ python
@contextlib.contextmanager
def registries_restored():
    """mmengine's, mmseg's and mmdet's MODELS as they were, whatever a snippet registers."""
    from mmengine.registry import MODELS
    registries = [MODELS] + [importlib.import_module(f'{s}.registry').MODELS
                             for s in ('mmseg', 'mmdet')]
    saved = [dict(r._module_dict) for r in registries]
    try:
        yield
    finally:
        for registry, modules in zip(registries, saved):
            registry._module_dict.clear()
            registry._module_dict.update(modules)


@pytest.mark.parametrize('block', blocks_of('python'), ids=lambda b: b.id)
def test_python_snippet_runs(block):
    from mmengine.registry import MODELS
    mixer = block.kind.group('mixer')
    with registries_restored():
        namespace = {'__name__': f'snippet_{block.page}_{block.line}'}
        exec(compile(block.text, block.id, 'exec'), namespace)
        if mixer:
            from nala_mm.models import NaLaFormer
            assert mixer in MODELS.module_dict, f'{block.id} registers no {mixer}'
            model = NaLaFormer(arch=TINY_ARCH, mixers=(dict(type=mixer),) * 4)
            outs = model(torch.randn(1, 3, 64, 64))
            sum(o.square().mean() for o in outs).backward()
            assert all(torch.isfinite(o).all() for o in outs)
            assert all(p.grad is not None and torch.isfinite(p.grad).all()
                       for p in model.parameters() if p.requires_grad)
    if mixer:
        assert mixer not in MODELS.module_dict  # the registry is as it was


# ------------------------------------------------------------------------------ usage
def usage_lines(text: str) -> List[List[str]]:
    """The block's commands as word lists (continuations joined, comments and
    ``[optional]`` brackets dropped)."""
    joined = re.sub(r'\\\n', ' ', text)
    commands = []
    for line in joined.splitlines():
        line = line.split('  #')[0].split(' # ')[0].strip()
        if not line or line.startswith('#'):
            continue
        words = shlex.split(line.replace('[', ' ').replace(']', ' ').replace('|', ' '),
                            posix=True)
        while words and re.match(r'[A-Z_][A-Z0-9_]*=', words[0]):  # VAR=value prefixes
            words.pop(0)
        if words:
            commands.append(words)
    return commands


# scripts that hand their options to a tool, and the tools mim runs
FORWARDS = {'tools/dist_train.sh': 'tools/train.py', 'tools/slurm_train.sh': 'tools/train.py',
            'tools/dist_test.sh': 'tools/test.py', 'tools/slurm_test.sh': 'tools/test.py',
            'mim train': 'tools/train.py', 'mim test': 'tools/test.py'}


HELP_RUNNER = textwrap.dedent('''
    import contextlib, io, json, os, runpy, sys
    out = {}
    for key, argv in json.loads(sys.argv[1]):
        buffer = io.StringIO()
        code = 0
        saved = list(sys.path)
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                sys.argv = [argv[-1], '--help'] if argv[0] != '-m' else [argv[1], '--help']
                if argv[0] == '-m':
                    runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
                else:
                    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
                    runpy.run_path(argv[0], run_name='__main__')
        except SystemExit as exit:
            code = exit.code or 0
        except BaseException as error:
            code, buffer = 1, io.StringIO(repr(error))
        finally:
            sys.path[:] = saved
        out[key] = dict(code=code, text=buffer.getvalue())
    print(json.dumps(out))
''')


def _python_target(words: List[str]) -> Optional[List[str]]:
    """``python X.py ...`` -> [X.py]; ``python -m pkg.mod ...`` -> ['-m', 'pkg.mod']."""
    if words[0] not in ('python', 'python3'):
        return None
    return ['-m', words[2]] if words[1] == '-m' else [words[1]]


@pytest.fixture(scope='module')
def python_help() -> Dict[str, dict]:
    """``--help`` of every python script and module the usage blocks name, in one process."""
    targets = {tool: [str(REPO / tool)] for tool in set(FORWARDS.values())}
    for block in blocks_of('usage'):
        for words in usage_lines(block.text):
            target = _python_target(words)
            if target:
                targets[' '.join(target)] = [str(REPO / target[0])] if target[0] != '-m' \
                    else target
    if not targets:
        return {}
    proc = subprocess.run([PYTHON, '-c', HELP_RUNNER, json.dumps(list(targets.items()))],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=tool_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _options(words: List[str]) -> List[str]:
    return sorted({w.split('=')[0] for w in words if re.match(r'--[a-z][\w-]*', w)})


@pytest.mark.integration
@pytest.mark.parametrize('block', blocks_of('usage'), ids=lambda b: b.id)
def test_usage_snippet_names_real_commands_and_options(block, python_help):
    problems = []
    for words in usage_lines(block.text):
        line = ' '.join(words)
        target = _python_target(words)
        if target:
            answer = python_help[' '.join(target)]
            if answer['code'] != 0:
                problems.append(f'{line}: --help exited {answer["code"]}: {answer["text"][-300:]}')
                continue
            missing = [o for o in _options(words[2:]) if not re.search(
                rf'(?<![\w-]){re.escape(o)}(?![\w-])', answer['text'])]
            problems += [f'{line}: {o} is not in its --help' for o in missing]
        elif words[0] == 'mim':
            proc = subprocess.run([str(Path(PYTHON).parent / 'mim'), words[1], '--help'],
                                  capture_output=True, text=True, timeout=120, env=tool_env())
            # mim hands the options it does not know to the package's tool
            tool = python_help.get(FORWARDS.get(f'mim {words[1]}', ''), {}).get('text', '')
            missing = [o for o in _options(words[2:]) if not re.search(
                rf'(?<![\w-]){re.escape(o)}(?![\w-])', proc.stdout + tool)]
            if proc.returncode != 0 or missing:
                problems.append(f'{line}: mim {words[1]} --help: rc {proc.returncode}, '
                                f'missing {missing}')
        elif words[0] == 'make':
            for target in words[1:]:
                proc = subprocess.run(['make', '-n', target], cwd=REPO, capture_output=True,
                                      text=True, timeout=60)
                if proc.returncode != 0:
                    problems.append(f'{line}: make has no target {target}: {proc.stderr}')
        else:
            script = next((w for w in words if w.endswith('.sh')), None)
            if script is None:
                problems.append(f'{line}: no way to check this command (python, mim, make or a '
                                'tools/*.sh script)')
                continue
            path = REPO / script
            if not (path.is_file() and os.access(path, os.X_OK)):
                problems.append(f'{line}: {script} is not an executable file')
            elif subprocess.run(['bash', '-n', str(path)]).returncode != 0:
                problems.append(f'{line}: bash -n rejects {script}')
            elif script in FORWARDS:
                tool = python_help[FORWARDS[script]]['text']
                after = words[words.index(script) + 1:]
                problems += [f'{line}: {o} is not an option of {FORWARDS[script]}'
                             for o in _options(after) if not re.search(
                                 rf'(?<![\w-]){re.escape(o)}(?![\w-])', tool)]
    assert not problems, f'{block.id}:\n  ' + '\n  '.join(problems)


# ------------------------------------------------------------------------------ shell
@pytest.fixture(scope='module')
def checkout_like(tmp_path_factory):
    """A scratch folder laid out as the checkout, with small demo data generated in place."""
    from nala_mm.datasets.synthetic_ade import generate_ade_like
    from nala_mm.datasets.synthetic_coco import generate_coco_like
    root = tmp_path_factory.mktemp('checkout')
    for name in ('configs', 'tools', 'benchmarks', '.venv', 'Makefile'):
        if (REPO / name).exists():
            (root / name).symlink_to(REPO / name)
    generate_ade_like(str(root / 'data/demo/ade/ADEChallengeData2016'), num_train=8, num_val=2,
                      image_size=(96, 96), progress=False)
    generate_coco_like(str(root / 'data/demo/coco'), num_train=2, num_val=2,
                       image_size=(128, 128), progress=False)
    return root


@pytest.mark.extended
@pytest.mark.integration
@pytest.mark.parametrize('block', blocks_of('shell'), ids=lambda b: b.id)
def test_shell_snippet_runs(block, checkout_like):
    env = tool_env(PATH=f'{Path(PYTHON).parent}{os.pathsep}{os.environ["PATH"]}')
    proc = subprocess.run(['bash', '-c', 'set -euo pipefail\n' + block.text], cwd=checkout_like,
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f'{block.id}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'


def test_the_readme_nalaformer_snippet_sets_the_auxiliary_head_for_stage_3(tmp_path):
    """The README's first snippet (NaLaFormer in mmseg's Swin-T UperNet config) fails at the first
    forward unless the auxiliary head reads NaLaFormer-T's stage-3 width (Swin's is 384)."""
    first = next(b for b in blocks_of('config') if b.page == 'README.md' and
                 b.kind.group('config_base'))
    assert 'swin-tiny' in first.kind.group('config_base')
    assert re.search(r'auxiliary_head=dict\(in_channels=256\)', first.text), first.text
    broken = copy.copy(first)
    broken.text = re.sub(r',\s*auxiliary_head=dict\(in_channels=256\)', '', first.text)
    assert broken.text != first.text
    ast.parse(broken.text)
    # without it the step fails as the issue reported (the auxiliary conv expects 384 channels)
    path = tmp_path / 'broken.py'
    path.write_text(config_texts(broken)[0])
    with pytest.raises(RuntimeError, match='384'):
        one_training_step(str(path))


if __name__ == '__main__':  # list the blocks and their kinds
    for b in ALL_BLOCKS:
        print(f'{b.id:<28} {b.spec or "-":<60} {b.problem or ""}')
    sys.exit(0)
