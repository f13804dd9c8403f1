"""The authors' classification checkpoints loaded by mmpretrain's Runner (``load_from``,
mmpretrain's ``tools/test.py CONFIG CHECKPOINT``); the conversion itself is
:func:`nala_mm.models.classifier.convert_authors_checkpoint`. Registered in mmpretrain's
``HOOKS``, only where mmpretrain is installed."""
from mmengine.hooks import Hook
from mmengine.logging import print_log

from ...models.classifier import convert_authors_checkpoint, is_authors_checkpoint
from ...registry import register_hook


@register_hook(scope='mmpretrain')
class AuthorsCheckpointHook(Hook):
    """Loads the authors' classification checkpoints into a NaLaFormer ``ImageClassifier``.

    When the Runner loads a file laid out as the authors' (``load_from``; mmpretrain's
    ``tools/test.py CONFIG CHECKPOINT``), the checkpoint is rewritten in place by
    :func:`convert_authors_checkpoint` before any other hook or the model sees it, and what was
    loaded is logged. Any other checkpoint passes untouched. Resuming from an authors' file is
    refused (its optimizer and schedule are timm's, not mmengine's).
    """

    priority = 'VERY_HIGH'  # before EMAHook, which reads checkpoint['state_dict']

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not is_authors_checkpoint(checkpoint):
            return
        source = f'checkpoint {runner._load_from}' if getattr(runner, '_load_from', None) \
            else 'the checkpoint'
        if getattr(runner, '_resume', False):
            raise ValueError(
                f"{source} is an authors' checkpoint (timm optimizer and schedule state): it "
                'cannot resume an mmengine run. Load it instead (load_from=PATH, resume=False): '
                'the weights load, the schedule starts anew.')
        converted = convert_authors_checkpoint(checkpoint, runner.model, source=source)
        checkpoint.update(converted)
        backbone = sum(k.startswith('backbone.') for k in converted['state_dict'])
        tail = len(converted['state_dict']) - backbone
        weights = ("the EMA weights ('model_ema') as state_dict and the trained ones ('model') "
                   'as ema_state_dict' if converted['meta']['ema'] else
                   "its 'model' weights (no 'model_ema' in the file)")
        print_log(f"NaLaFormer classifier: {source} is an authors' checkpoint; loading "
                  f'{backbone} backbone and {tail} tail tensors (proj, norm -> neck; head -> '
                  f'head.fc), RoPE frequencies checked; {weights}', logger='current')
