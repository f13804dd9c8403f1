"""A hook that kills its own process with SIGKILL right after a chosen training iteration has
been logged (and checkpointed, if due): a crash at a fixed point, whatever the machine's speed.
Imported by the kill-and-resume test's config (``custom_imports``)."""
import os
import signal

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class KillAfterIterHook(Hook):
    priority = 'LOWEST'  # after the LoggerHook and the CheckpointHook of the same iteration

    def __init__(self, iteration: int):
        self.iteration = iteration

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.iteration:  # runner.iter counts completed iterations - 1 here
            os.kill(os.getpid(), signal.SIGKILL)
