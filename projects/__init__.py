"""Research projects built on nala_mm, as mmseg 1.x's ``projects/``: each folder holds its own
README, code, configs, committed results and tests, and is not part of the installed package.
Run from the repository root (``python -m projects.NAME.MODULE``); a config of a project imports
its modules with ``custom_imports``, which needs the root on ``PYTHONPATH`` under tools/train.py."""
