"""mmengine's ``HistoryBuffer`` pickles its data only, through ``copyreg``.

Why: a Runner checkpoint holds the message hub, whose ``HistoryBuffer`` objects pickle (by their
own ``__getstate__``, mmengine 0.10.7) the class-level statistics-method table: functions,
pickled through ``builtins.getattr``. torch >= 2.6 unpickles weights-only by default, and
allow-listing ``getattr`` would reopen arbitrary code execution. With this change a buffer
pickles as a call of :func:`rebuild_history_buffer` on its length limit and two numpy arrays,
which :mod:`nala_mm.compat.safe_globals` allow-lists. Needed with mmengine 0.10.7 (every 0.10
release pickles the table) under torch >= 2.6.

The change is an entry in ``copyreg.dispatch_table`` (which ``pickle`` consults before the
class's own reduction); the class itself is untouched.
"""
import copyreg
from typing import Callable, Tuple

from mmengine.logging import HistoryBuffer


def rebuild_history_buffer(max_length: int, log_history, count_history) -> HistoryBuffer:
    """The buffer a checkpoint saved with this change holds (the statistics methods are the
    class's own)."""
    return HistoryBuffer(log_history, count_history, max_length)


def reduce_history_buffer(buffer: HistoryBuffer) -> Tuple[Callable, tuple]:
    return rebuild_history_buffer, (buffer.max_length, buffer._log_history,
                                    buffer._count_history)


def apply() -> Callable[[], None]:
    """Make the change; returns what undoes it."""
    previous = copyreg.dispatch_table.get(HistoryBuffer)
    copyreg.pickle(HistoryBuffer, reduce_history_buffer)

    def undo() -> None:
        if previous is None:
            copyreg.dispatch_table.pop(HistoryBuffer, None)
        else:
            copyreg.dispatch_table[HistoryBuffer] = previous
    return undo
