"""nala-mm: NaLaFormer (norm-aware linear attention) for MMSegmentation 1.x and MMDetection 3.x.

Packaged the way OpenMMLab packages ship (mmseg's and mmdet's ``add_mim_extension``): the
configs, the tools and ``model-index.yml`` live under ``nala_mm/.mim/``, where ``mim train``,
``mim test`` and ``mim search`` look for them.

* Built packages (wheel, sdist) carry **copies**, written into the build directories only; the
  checkout is never modified by a build.
* In the checkout ``nala_mm/.mim/`` holds **symbolic links** to ``configs/``, ``tools/`` and
  ``model-index.yml`` (git-ignored). ``python setup.py develop`` makes them and installs the
  checkout in place (see :class:`Develop`); ``make setup`` runs it.
"""
import os
import os.path as osp
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile

from setuptools import Command, find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = osp.dirname(osp.abspath(__file__))
NAME = 'nala-mm'
# What mim reads under <package>/.mim/. model-index.yml imports the metafiles inside configs/.
MIM_ITEMS = ('configs', 'tools', 'model-index.yml')
MIM_DIR = osp.join('nala_mm', '.mim')
# checkout-only tools: setting up a checkout's environment means nothing inside a wheel
NOT_SHIPPED = ('setup_env.sh', '__pycache__', '*.pyc')


def read_version() -> str:
    scope: dict = {}
    with open(osp.join(HERE, 'nala_mm', 'version.py'), encoding='utf-8') as f:
        exec(f.read(), scope)
    return scope['__version__']


def mim_source(root: str, item: str) -> str:
    """Where ``item`` is in a source tree: the checkout's top level, or ``nala_mm/.mim/`` in an
    unpacked sdist (which carries the copies only)."""
    top = osp.join(root, item)
    return top if osp.exists(top) else osp.join(root, MIM_DIR, item)


def copy_mim_items(root: str, target: str) -> None:
    """Copy the mim items of source tree ``root`` into the folder ``target`` (a build's
    ``nala_mm/.mim``), following links, so a built package holds plain files."""
    if osp.islink(target):
        os.unlink(target)
    os.makedirs(target, exist_ok=True)
    for item in MIM_ITEMS:
        source, copy = mim_source(root, item), osp.join(target, item)
        if not osp.exists(source):
            raise FileNotFoundError(f'{item} not found in {root} (nor in {MIM_DIR}): a nala-mm '
                                    'package must carry it for mim')
        if osp.lexists(copy):  # a link left from the checkout, or an earlier build
            shutil.rmtree(copy) if osp.isdir(copy) and not osp.islink(copy) else os.unlink(copy)
        if osp.isdir(source):
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
        else:
            shutil.copyfile(source, copy)


def link_mim_items(root: str) -> None:
    """``nala_mm/.mim/{configs,tools,model-index.yml}`` as relative links to the checkout's
    files, so that an installed-in-place checkout looks to mim like a built package."""
    target = osp.join(root, MIM_DIR)
    os.makedirs(target, exist_ok=True)
    for item in MIM_ITEMS:
        link = osp.join(target, item)
        wanted = osp.join('..', '..', item)
        if osp.islink(link) and os.readlink(link) == wanted:
            continue
        if osp.lexists(link):
            shutil.rmtree(link) if osp.isdir(link) and not osp.islink(link) else os.unlink(link)
        os.symlink(wanted, link)


class BuildPy(build_py):
    """build_py, plus the mim items copied into the build's ``nala_mm/.mim`` (what a wheel
    ships); in setuptools' own editable build (``pip install -e .``) the checkout's links."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            link_mim_items(HERE)
        else:
            copy_mim_items(HERE, osp.join(self.build_lib, MIM_DIR))


class Sdist(sdist):
    """sdist, plus copies of the mim items under ``nala_mm/.mim`` of the release tree."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        copy_mim_items(HERE, osp.join(base_dir, MIM_DIR))


class Develop(Command):
    """Install the checkout in place, with its distribution metadata in the checkout.

    mim (``get_installed_path``) and mmengine look for an installed package at
    ``<distribution location>/nala_mm``. setuptools' PEP 660 editable installs keep the metadata
    in site-packages, where no ``nala_mm`` folder exists, so mim cannot find the package; and
    since setuptools 80 its ``develop`` is such an install. This command writes the layout
    ``develop`` wrote before: ``nala_mm.egg-info`` in the checkout, the checkout on ``sys.path``
    through ``easy-install.pth``, and ``nala-mm.egg-link``, by which ``pip uninstall nala-mm``
    removes it again; plus the ``nala_mm/.mim`` links. It installs no dependencies.

    ``python setup.py develop`` runs it (``make setup`` does); so does ``pip install -e .`` with
    pip versions that still install a project without ``pyproject.toml`` through ``setup.py
    develop`` (pip < 25, e.g. the 23.2 ``make setup`` uses), which pass the options below.
    """

    description = 'install the checkout in place (metadata in the checkout; mim finds it)'
    user_options = [('install-dir=', 'd', 'the site-packages folder to install into'),
                    ('no-deps', 'N', 'accepted for pip; no dependencies are installed anyway'),
                    ('user', None, 'install into the user site-packages'),
                    ('prefix=', None, 'installation prefix')]
    boolean_options = ['no-deps', 'user']

    def initialize_options(self):
        self.install_dir = self.prefix = None
        self.no_deps = self.user = False

    def finalize_options(self):
        if self.install_dir is None:
            if self.user:
                self.install_dir = site.getusersitepackages()
            elif self.prefix:
                self.install_dir = sysconfig.get_paths(
                    vars={'base': self.prefix, 'platbase': self.prefix})['purelib']
            else:
                self.install_dir = sysconfig.get_paths()['purelib']

    def run(self):
        # An earlier PEP 660 install of this project would shadow this one (its metadata comes
        # first on sys.path). Run from elsewhere so that pip does not take the checkout's own
        # nala_mm.egg-info for an installation.
        subprocess.run([sys.executable, '-m', 'pip', 'uninstall', '-y', '-q', NAME], check=False,
                       capture_output=True, cwd=tempfile.gettempdir())
        # nala_mm.egg-info beside the package, whatever the working folder
        self.distribution.get_command_obj('egg_info').egg_base = HERE
        self.run_command('egg_info')
        link_mim_items(HERE)
        os.makedirs(self.install_dir, exist_ok=True)
        with open(osp.join(self.install_dir, f'{NAME}.egg-link'), 'w') as f:
            f.write(f'{HERE}\n.')
        pth = osp.join(self.install_dir, 'easy-install.pth')
        entries = open(pth).read().splitlines() if osp.exists(pth) else []
        if HERE not in entries:
            with open(pth, 'w') as f:
                f.write('\n'.join(entries + [HERE]) + '\n')
        print(f'{NAME} installed in place from {HERE} into {self.install_dir}')


setup(
    name=NAME,
    version=read_version(),
    description='NaLaFormer backbones and norm-aware linear attention for OpenMMLab '
                '(mmsegmentation 1.x, mmdet 3.x)',
    long_description=open(osp.join(HERE, 'README.md'), encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    url='https://github.com/ZacharyMeng/NaLaFormer',
    packages=find_packages(include=['nala_mm', 'nala_mm.*']),
    python_requires='>=3.9',
    # Compatible ranges: an existing OpenMMLab environment keeps its versions. Tested: what
    # `make setup` installs, requirements/tested.txt. nala_mm.compat and the tools' data checks read
    # internals of the mmengine 0.10 (HistoryBuffer's fields, the Runner's build order), mmseg 1.2
    # and mmdet 3.3 (dataset attributes) lines, hence the lower bounds.
    # mmcv is deliberately not listed: pip would build it from source *without* its compiled
    # ops (RoIAlign, NMS), and mmseg 1.2 / mmdet 3.3 accept only mmcv < 2.2. Install mmcv 2.1
    # with its ops first (README, "Install notes").
    # mmseg is required: every swapped ViT, ViTDet's too, subclasses mmseg's VisionTransformer.
    install_requires=[
        'torch>=2.4',  # torch.serialization.add_safe_globals (weights-only Runner checkpoints)
        'mmengine>=0.10.0,<1.0.0',
        'mmsegmentation>=1.2.0,<2.0.0',
        'einops',
        'numpy<2.3',
        'ftfy',
        'regex',
        'matplotlib',
        'tqdm',
    ],
    extras_require={'tests': ['pytest', 'hypothesis'],
                    # detection (default_scope 'mmdet' configs, the mmdet backbones, ViTDet's
                    # SimpleFPN): nala_mm registers its mmdet part only where mmdet imports
                    'det': ['mmdet>=3.3.0,<4.0.0', 'pycocotools'],
                    # tools/export_onnx.py and benchmarks/speed/deploy.py
                    'deploy': ['onnx', 'onnxruntime', 'onnxscript'],
                    # configs/imagenet: mmpretrain imports torchvision without declaring it;
                    # install the torchvision built for your torch first (each wheel pins one)
                    'pretrain': ['mmpretrain>=1.2.0,<2.0.0', 'torchvision']},
    cmdclass={'build_py': BuildPy, 'sdist': Sdist, 'develop': Develop},
    license='Apache-2.0',
    zip_safe=False,
)
