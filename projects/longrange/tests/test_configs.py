"""The project's configs: the long-range ViTs are mmseg's stock ViT and its NaLa swap, and the
task's config registers MixerStatsHook through its custom_imports (import nala_mm does not)."""
import subprocess
import sys

from mmengine.config import Config
from mmengine.registry import init_default_scope

from tests.helpers import REPO

CONFIGS = REPO / 'projects' / 'longrange' / 'configs'
LONGRANGE_VIT = ('ade20k_longrange_vit.py', 'ade20k_longrange_vit_nala.py')


def test_the_long_range_vits_are_the_stock_vit_and_its_swap():
    """One ViT layer decoded at stride 8 from the 16 x 16 patch grid; the swap changes the
    backbone type and its layer's mixer only."""
    from nala_mm.models.swap import NaLaVisionTransformer
    stock_cfg, swap_cfg = (Config.fromfile(str(CONFIGS / n)) for n in LONGRANGE_VIT)
    init_default_scope('mmseg')
    from mmseg.registry import MODELS  # built for real: mmseg's ViT reads its drop rates
    stock, swapped = MODELS.build(stock_cfg.model), MODELS.build(swap_cfg.model)
    assert type(stock.backbone).__name__ == 'VisionTransformer'
    assert type(swapped.backbone) is NaLaVisionTransformer
    assert swapped.backbone.mixers == ('nala',) and len(swapped.backbone.layers) == 1
    assert stock.backbone.patch_size == 8 and stock.decode_head.in_channels == [64]
    ours, theirs = dict(swap_cfg.model.backbone), dict(stock_cfg.model.backbone)
    assert ours.pop('type') == 'NaLaVisionTransformer' and ours.pop('mixers') == ('nala',)
    theirs.pop('type')
    assert ours == theirs


def test_the_hook_registers_through_the_config_not_through_the_package():
    """A fresh interpreter: import nala_mm leaves MixerStatsHook unregistered and the project
    unloaded; the task config's custom_imports register it."""
    code = (
        "import sys\n"
        "import nala_mm\n"
        "from mmengine.registry import HOOKS\n"
        "from mmengine.utils import import_modules_from_strings\n"
        "from mmengine.config import Config\n"
        "before = HOOKS.get('MixerStatsHook') is None and not any("
        "m.startswith('projects') for m in sys.modules)\n"
        f"cfg = Config.fromfile({str(CONFIGS / 'ade20k_longrange_segformer.py')!r})\n"
        "import_modules_from_strings(**cfg.custom_imports)\n"
        "print(before, HOOKS.get('MixerStatsHook').__module__)\n")
    proc = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ['True', 'projects.longrange.training_stats']
