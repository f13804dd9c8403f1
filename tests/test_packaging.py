"""Shipping as OpenMMLab packages ship: the model index, the requirement ranges, the installed
path of the configs, and (``make test-extended``) the wheel and the sdist and ``mim`` from an
installed wheel and from the checkout's own environment.

* Every config is listed in exactly one metafile, with the architecture, schedule, dataset,
  batch and crop its file defines; basenames are unique (mim finds a config by basename across
  the package). Paper numbers are targets under ``Metadata``, never ``Results``; no weights.
* The wheel and the sdist built from the files of a clean checkout carry ``nala_mm/.mim/``
  (configs, tools, ``model-index.yml``) as plain files.
* Installed on its own (a scratch environment that reuses the installed dependencies, no
  checkout on ``sys.path``), and in the checkout's ``make setup`` environment, ``mim train``,
  ``mim test`` and ``mim search`` work from an empty folder.
"""
import glob
import json
import os
import os.path as osp
import re
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.configs.test_configs import load
from tests.helpers import PYTHON, REPO

CONFIGS = sorted(p for p in glob.glob(str(REPO / 'configs' / '**' / '*.py'), recursive=True))
RUNNABLE = [p for p in CONFIGS if '/_base_/' not in p]


def model_index():
    from modelindex.load_model_index import load as load_index
    return load_index(str(REPO / 'model-index.yml'))


def models():
    return list(model_index().models)  # with their collections' fields (load() merges them)


def test_model_index_loads_and_modelindex_finds_no_errors():
    errors = model_index().check(silent=True)
    assert not errors, errors


def test_every_config_is_listed_once_and_basenames_are_unique():
    listed = [m.config for m in models()]
    runnable = [osp.relpath(p, REPO) for p in RUNNABLE]
    assert sorted(listed) == sorted(runnable), (
        f'not listed: {sorted(set(runnable) - set(listed))}; listed but no such config: '
        f'{sorted(set(listed) - set(runnable))}; twice: '
        f'{sorted({c for c in listed if listed.count(c) > 1})}')
    names = [osp.basename(p) for p in CONFIGS]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    model_names = [m.name for m in models()]
    assert len(model_names) == len(set(model_names))


DATASETS = {'ADE20KDataset': 'ADE20K', 'CocoDataset': 'COCO', 'CityscapesDataset': 'Cityscapes',
            'ImageNet': 'ImageNet-1K'}
HEADS = {'UPerHead': 'UperNet', 'FPNHead': 'Semantic FPN', 'SegformerHead': 'SegFormer head',
         'LinearClsHead': 'Linear classifier',
         'SegmenterMaskTransformerHead': 'Segmenter mask transformer', 'SETRUPHead': 'SETR-Naive',
         'MaskRCNN': 'Mask R-CNN', 'RetinaNet': 'RetinaNet'}
BACKBONES = {'SwinTransformer': 'Swin-T', 'NaLaSwinTransformer': 'Swin-T',
             'NaLaMixVisionTransformer': 'MiT-B0', 'NaLaPyramidVisionTransformerV2': 'PVTv2-B0'}


def _schedule(cfg) -> str:
    train = cfg.train_cfg
    if 'max_iters' in train:
        return f'{train.max_iters / 1000:g}k iterations'
    return f'{train.max_epochs} epochs'


def _head(cfg) -> str:
    if cfg.default_scope == 'mmpretrain':
        return cfg.model.head.type
    return cfg.model.type if cfg.default_scope == 'mmdet' else cfg.model.decode_head.type


def _backbone(cfg) -> str:
    backbone = cfg.model.backbone
    if backbone.type == 'NaLaFormer':
        return 'NaLaFormer' if isinstance(backbone.arch, dict) else \
            f'NaLaFormer-{backbone.arch.upper()}'
    if backbone.type in ('NaLaVisionTransformer', 'VisionTransformer'):
        return {384: 'DeiT-S' if 'deit' in cfg.filename else 'ViT-S', 768: 'ViT-B',
                1024: 'ViT-L'}.get(
            backbone.embed_dims, 'ViT')
    return BACKBONES[backbone.type]


@pytest.mark.parametrize('entry', models(), ids=lambda m: m.name)
def test_each_metafile_entry_describes_its_config(entry):
    cfg = load(str(REPO / entry.config))
    meta = entry.metadata.data
    architecture = meta['Architecture']
    assert architecture[0].startswith(_backbone(cfg)), (architecture, _backbone(cfg))
    assert architecture[1].startswith(HEADS[_head(cfg)]), (architecture, _head(cfg))
    assert meta['Schedule'] == _schedule(cfg)
    assert meta['Batch Size'] == cfg.auto_scale_lr.base_batch_size
    dataset = cfg.train_dataloader.dataset
    dataset = dataset.dataset if dataset.type == 'RepeatDataset' else dataset  # (LSJ's)
    data_root = dataset.data_root
    if 'demo' in data_root:
        assert meta['Training Data'].startswith('generated'), meta['Training Data']
    else:
        assert meta['Training Data'] == DATASETS[dataset.type]
    crop = meta['Crop Size']
    pipeline = dataset.pipeline
    if any(t.type == 'RandomCrop' for t in pipeline):
        size = cfg.crop_size if 'crop_size' in cfg else cfg.image_size
        assert crop == 'x'.join(map(str, size))
    elif any(t.type == 'RandomResizedCrop' for t in pipeline):  # a classifier's square crop
        side, = {t.scale for t in pipeline if t.type == 'RandomResizedCrop'}
        assert crop.startswith(f'{side}x{side}'), crop
    else:  # no crop: the sizes the entry names are the pipeline's resize scales or image size
        assert crop.startswith('none'), crop
        sizes = set(map(str, cfg.get('image_size', ())))
        for transform in pipeline:
            scales = transform.get('scale') or transform.get('scales') or ()
            for scale in (scales if scales and isinstance(scales[0], (list, tuple)) else
                          [scales]):
                sizes |= set(map(str, scale))
        assert set(re.findall(r'\d+', crop)) <= sizes, (crop, sizes)
    assert meta['Weights'] == 'none'
    assert getattr(entry, 'weights', None) is None  # nothing for `mim download` to fetch


def test_paper_targets_are_metadata_labelled_not_reproduced_and_match_the_paper_table():
    """The paper's ImageNet-1K top-1 per variant, as docs/user_guides/method.md cites it; under
    Metadata, never as a Result (mim search shows Results as plain metrics)."""
    method = (REPO / 'docs' / 'user_guides' / 'method.md').read_text()
    paper = {row[0]: row[-1] for row in (
        [c.strip() for c in line.strip('|').split('|')] for line in method.splitlines()
        if re.match(r'\| (XT|T|S|B|L) \|', line))}
    targets = 0
    for entry in models():
        meta = entry.metadata.data
        target = meta.get('Paper target')
        if target is not None:
            match = re.fullmatch(r'not reproduced, ImageNet-1K top-1 ([\d.]+) of the '
                                 r'NaLaFormer-(\w+) backbone', target)
            assert match, target
            assert paper[match.group(2)] == match.group(1), (entry.name, target)
            assert meta['Architecture'][0] == f'NaLaFormer-{match.group(2)}'
            targets += 1
        for result in entry.results or []:
            assert 'generated' in result.dataset, (entry.name, result.dataset)
    assert targets >= 10


def test_demo_results_are_the_committed_summaries():
    seg = json.loads((REPO / 'benchmarks/results/studies/demo_seg.json').read_text())
    det = json.loads((REPO / 'benchmarks/results/studies/demo_det.json').read_text())
    by_config = {m.config: m for m in models()}
    seg_result, = by_config['configs/demo/ade20k_demo_nala_upernet.py'].results
    assert seg_result.metrics['mIoU'] == round(seg['metrics']['mIoU'], 2)
    box, mask = by_config['configs/demo/coco_demo_nala_mask-rcnn.py'].results
    assert box.metrics['box AP'] == round(100 * det['metrics']['coco/bbox_mAP'], 1)
    assert mask.metrics['mask AP'] == round(100 * det['metrics']['coco/segm_mAP'], 1)


# ------------------------------------------------------------------------------ requirements
PINNED = dict(line.split('==') for line in (REPO / 'requirements' / 'tested.txt').read_text()
              .splitlines() if line and not line.startswith('#'))


def _setup_keyword(name: str):
    import ast
    tree = ast.parse((REPO / 'setup.py').read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f'setup.py has no {name}')


def _setup_requirements(*extras: str):
    """install_requires, and the requirements of ``extras``."""
    lines = _setup_keyword('install_requires') + [
        line for extra in extras for line in _setup_keyword('extras_require')[extra]]
    return [Requirement(line) for line in lines]


def test_requirements_are_ranges_the_tested_combination_satisfies():
    requirements = {r.name: r for r in _setup_requirements('det')}
    assert 'mmcv' not in requirements  # built with its ops by hand (README, Install notes)
    for name in ('mmengine', 'mmsegmentation', 'mmdet'):
        spec = requirements[name].specifier
        assert not any(s.operator in ('==', '===', '~=') for s in spec), (name, str(spec))
        assert any(s.operator == '<' for s in spec) and any(s.operator == '>=' for s in spec)
        # the tested version is inside, and so is a later patch release
        assert spec.contains(PINNED[name])
        major, minor, patch = map(int, PINNED[name].split('.'))
        assert spec.contains(f'{major}.{minor}.{patch + 1}'), (name, str(spec))
    for name, requirement in requirements.items():
        installed = metadata.version(name)
        assert requirement.specifier.contains(installed, prereleases=True), (name, installed)


def test_detection_is_an_extra_and_segmentation_needs_no_mmdet():
    """mmdet and pycocotools come with ``nala-mm[det]`` (tests/test_optional_mmdet.py: the
    package without them); mmseg stays required (the ViT family subclasses mmseg's)."""
    required = {r.name for r in _setup_requirements()}
    det = {r.name for r in _setup_requirements('det')} - required
    assert 'mmsegmentation' in required
    assert det == {'mmdet', 'pycocotools'}
    assert 'mmdet' in PINNED  # make setup still installs it (tests, make demo-det)


# ------------------------------------------------------------------------------ installed paths
def test_config_path_finds_configs_by_basename_and_relative_path():
    from nala_mm.apis.config_path import all_configs, config_path, configs_root
    root = configs_root()
    by_name = config_path('ade20k_demo_nala_upernet.py')
    assert by_name == osp.join(root, 'demo', 'ade20k_demo_nala_upernet.py')
    assert osp.samefile(by_name, REPO / 'configs' / 'demo' / 'ade20k_demo_nala_upernet.py')
    assert config_path('demo/ade20k_demo_nala_upernet.py') == by_name
    assert len(all_configs(root)) == len(CONFIGS)
    with pytest.raises(FileNotFoundError, match="close names: .*'ade20k_nala_upernet.py'"):
        config_path('ade20k_nala_upernett.py')
    with pytest.raises(ValueError, match="a config is a .py file; got 'ade20k_nala_upernet'"):
        config_path('ade20k_nala_upernet')


def test_a_user_config_inherits_an_installed_config_by_its_absolute_path(tmp_path):
    """The documented route: mmengine's pkg:: bases know only its own packages."""
    from mmengine.config import Config

    from nala_mm.apis.config_path import config_path
    mine = tmp_path / 'mine.py'
    mine.write_text(f"_base_ = [{config_path('ade20k_nala_upernet.py')!r}]\n"
                    "model = dict(backbone=dict(drop_path_rate=0.2))\n")
    cfg = Config.fromfile(str(mine))
    assert cfg.model.backbone.type == 'NaLaFormer' and cfg.model.backbone.drop_path_rate == 0.2
    assert cfg.model.decode_head.type == 'UPerHead'  # the mmseg:: chain came along
    assert cfg.auto_scale_lr.base_batch_size == 16


def test_the_checkout_is_installed_where_mim_and_mmengine_look():
    """make setup's in-place install: the distribution lives in the checkout, so
    <location>/nala_mm is the package and its .mim links to the checkout's files."""
    from mim.utils import get_installed_path as mim_path
    from mmengine.utils import get_installed_path as mmengine_path
    package = REPO / 'nala_mm'
    assert osp.samefile(mmengine_path('nala_mm'), package)
    assert osp.samefile(mim_path('nala_mm'), package)
    for item in ('configs', 'tools', 'model-index.yml'):
        link = package / '.mim' / item
        assert link.is_symlink() and os.readlink(link) == osp.join('..', '..', item), link
        assert osp.samefile(link, REPO / item)


def test_mim_search_lists_every_config():
    from mim.commands.search import get_model_info
    table = get_model_info('nala_mm', local=True, to_dict=True)
    listed = sorted(info['config'] for info in table.values())
    assert listed == sorted(osp.relpath(p, REPO) for p in RUNNABLE)
    t = table['upernet_nalaformer-t_8xb2-160k_ade20k-512x512']
    assert (t['training_data'], t['batch_size'], t['crop_size']) == ('ade20k', 16, '512x512')
    assert t['weights'] == 'none' and 'weight' not in t
    assert t['paper_target'].startswith('not reproduced')
    demo = table['upernet_nalaformer-demo_1xb8-2k_synthetic-ade-128x128']
    assert demo['generated ade20k-layout data/miou'] == 91.6


# ------------------------------------------------------------------------------ extended
def checkout_files() -> list:
    """The files a fresh clone would hold: tracked, or new and not ignored."""
    files = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard', '-z'],
                           cwd=REPO, capture_output=True, check=True).stdout.decode().split('\0')
    return [name for name in files if name and (REPO / name).is_file()]


def clean_checkout(destination: Path) -> Path:
    for name in checkout_files():
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode)
    return destination


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    """sdist and wheel (built from the sdist, as `python -m build` does) of a clean checkout."""
    work = tmp_path_factory.mktemp('build')
    source = clean_checkout(work / 'src')
    assert not (source / 'nala_mm' / '.mim').exists()
    proc = subprocess.run([PYTHON, '-m', 'build', '--no-isolation', '--outdir', str(work / 'dist'),
                           str(source)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (source / 'nala_mm' / '.mim').exists(), 'a build must not write into the tree'
    wheel, = (work / 'dist').glob('*.whl')
    sdist, = (work / 'dist').glob('*.tar.gz')
    return wheel, sdist


def _expected_mim_files():
    """What nala_mm/.mim must hold: the clean checkout's configs/ and tools/ (without
    tools/setup_env.sh, which sets up a checkout) and model-index.yml."""
    return sorted(name for name in checkout_files()
                  if name.startswith(('configs/', 'tools/')) and name != 'tools/setup_env.sh'
                  or name == 'model-index.yml')


@pytest.mark.extended
@pytest.mark.integration
def test_wheel_and_sdist_carry_configs_tools_and_model_index(built):
    wheel, sdist = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        mim = sorted(n[len('nala_mm/.mim/'):] for n in names if n.startswith('nala_mm/.mim/'))
        assert [n for n in mim if not n.endswith('.pyc')] == _expected_mim_files()
        # plain files (a zip stores a link's mode bits in external_attr)
        links = [i.filename for i in archive.infolist() if (i.external_attr >> 16) & 0o170000
                 == 0o120000]
        assert not links
        record = archive.read(next(n for n in names if n.endswith('RECORD'))).decode()
        assert 'nala_mm/.mim/model-index.yml' in record
        assert 'nala_mm/apis/config_path.py' in names
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split('/')[0]
        members = {m.name[len(top) + 1:]: m for m in archive.getmembers()}
        in_mim = sorted(n[len('nala_mm/.mim/'):] for n, m in members.items()
                        if n.startswith('nala_mm/.mim/') and m.isfile())
        assert in_mim == _expected_mim_files()
        assert not any(m.issym() for m in members.values())
        for name in ('LICENSE', 'CITATION.cff', 'CHANGELOG.md', 'README.md', 'setup.py'):
            assert name in members, name


def _scratch_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
    return dict(env, PYTHONWARNINGS='ignore', **extra)


def _run(argv, cwd, env, timeout=900) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f'{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}'
    return proc.stdout + proc.stderr


def mim_from_an_empty_folder(python: str, folder: Path, env: dict, package_dir: str) -> None:
    """The demo data generated, then mim train, test and search, and a config inheriting an
    installed one, all from ``folder``; every config found under ``package_dir``."""
    folder.mkdir()
    _run([python, '-m', 'nala_mm.datasets.demo', 'seg', '--num-train', '8', '--num-val', '2',
          '--size', '96', '96'], folder, env)
    log = _run([python, '-m', 'mim', 'train', 'nala_mm', 'ade20k_demo_nala_upernet.py',
                '--cfg-options', 'train_cfg.max_iters=2', 'default_hooks.logger.interval=1'],
               folder, env)
    used = osp.join(package_dir, '.mim', 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
    assert f'will use {osp.realpath(used)} instead' in log, log[-2000:]
    assert re.search(r'Iter\(train\) \[2/2\]', log), log[-2000:]
    checkpoint = folder / 'work_dirs' / 'ade20k_demo_nala_upernet' / 'iter_2.pth'
    assert checkpoint.is_file()
    log = _run([python, '-m', 'mim', 'test', 'nala_mm', 'ade20k_demo_nala_upernet.py',
                '--checkpoint', str(checkpoint)], folder, env)
    assert re.search(r'mIoU: [\d.]+', log), log[-2000:]
    _run([python, '-m', 'mim', 'search', 'nala_mm', '--json', 'search.json'], folder, env)
    found = json.loads((folder / 'search.json').read_text())  # pandas' layout: field -> model
    assert sorted(found['config'].values()) == sorted(
        osp.relpath(p, REPO) for p in RUNNABLE)
    path = _run([python, '-m', 'nala_mm.apis.config_path', 'ade20k_nala_upernet.py'], folder,
                env).strip().splitlines()[-1]
    assert path == osp.join(package_dir, '.mim', 'configs', 'ade20k_nala_upernet.py')
    (folder / 'mine.py').write_text(f"_base_ = [{path!r}]\n")
    out = _run([python, '-c', 'from mmengine.config import Config; '
                "print(Config.fromfile('mine.py').model.backbone.type)"], folder, env)
    assert out.strip().splitlines()[-1] == 'NaLaFormer'


@pytest.mark.extended
@pytest.mark.integration
def test_installed_wheel_trains_tests_and_searches_with_mim_from_an_empty_folder(built,
                                                                                  tmp_path):
    wheel, _ = built
    scratch = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(scratch)], check=True)
    python = str(scratch / 'bin' / 'python')
    site = _run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                tmp_path, _scratch_env()).strip()
    # the installed dependencies, reused: their folder as a plain path entry, so that its .pth
    # files (the checkout's in-place install) are not processed
    deps = _run([PYTHON, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                tmp_path, _scratch_env()).strip()
    (Path(site) / 'nala_dependencies.pth').write_text(deps + '\n')
    _run([PYTHON, '-m', 'pip', '--python', python, 'install', '--no-deps', '--no-index',
          str(wheel)], tmp_path, _scratch_env())
    env = _scratch_env()
    where = _run([python, '-c', 'import sys, nala_mm; from mmengine.utils import '
                  'get_installed_path as p; print(nala_mm.__file__); print(p("nala_mm")); '
                  f'print(any(e.rstrip("/") == {str(REPO)!r} for e in sys.path))'],
                 tmp_path, env).strip().splitlines()[-3:]
    package_dir = osp.join(site, 'nala_mm')
    assert where == [osp.join(package_dir, '__init__.py'), package_dir, 'False'], where
    mim_from_an_empty_folder(python, tmp_path / 'empty', env, package_dir)


@pytest.mark.extended
@pytest.mark.integration
def test_the_checkout_environment_trains_tests_and_searches_with_mim(tmp_path):
    env = _scratch_env()
    mim_from_an_empty_folder(PYTHON, tmp_path / 'empty', env, str(REPO / 'nala_mm'))
