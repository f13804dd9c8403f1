"""Where the installed package's configs are, for inheriting them from a config of your own.

    python -m nala_mm.apis.config_path ade20k_nala_upernet.py        # by basename (they are unique)
    python -m nala_mm.apis.config_path demo/ade20k_demo_nala_upernet.py
    python -m nala_mm.apis.config_path                              # the configs folder itself

mmengine's ``pkg::`` bases accept only the packages mmengine knows (``mmseg::``, ``mmdet::``, ...),
so a config of yours inherits this package's configs by absolute path::

    _base_ = ['/the/printed/path/ade20k_nala_upernet.py']

The configs are the ones ``mim train nala_mm`` uses: ``nala_mm/.mim/configs`` of the installed
package (a wheel's copies, or the checkout's links after ``make setup``). A checkout used
without installing (``PYTHONPATH`` only) has no ``.mim``; its ``configs/`` folder is used then.
"""
import argparse
import difflib
import os
import os.path as osp
import sys
from typing import List

PACKAGE_DIR = osp.dirname(osp.dirname(osp.abspath(__file__)))  # nala_mm/


def configs_root() -> str:
    """The folder holding the package's configs."""
    for candidate in (osp.join(PACKAGE_DIR, '.mim', 'configs'),
                      osp.join(osp.dirname(PACKAGE_DIR), 'configs')):
        if osp.isdir(candidate):
            return osp.abspath(candidate)
    raise FileNotFoundError(
        f'no configs found for nala_mm at {PACKAGE_DIR}/.mim/configs: install the package '
        '(pip install nala-mm from a wheel or sdist, or `make setup` in a checkout)')


def all_configs(root: str) -> List[str]:
    """Every config under ``root``, relative to it."""
    found = []
    for folder, _, files in os.walk(root, followlinks=True):
        found += [osp.relpath(osp.join(folder, name), root) for name in files
                  if name.endswith('.py') and '__pycache__' not in folder]
    return sorted(found)


def config_path(name: str) -> str:
    """The absolute path of config ``name``: a path relative to the configs folder
    (``demo/ade20k_demo_nala_upernet.py``) or a basename, which is unique among the configs."""
    root = configs_root()
    if not name.endswith('.py'):
        raise ValueError(f'a config is a .py file; got {name!r}')
    direct = osp.join(root, name)
    if osp.isfile(direct):
        return osp.abspath(direct)
    configs = all_configs(root)
    matches = [c for c in configs if osp.basename(c) == osp.basename(name)]
    if len(matches) == 1 and osp.sep not in name:
        return osp.join(root, matches[0])
    if len(matches) > 1:
        raise ValueError(f'{name!r} names {len(matches)} configs ({matches}); give the path '
                         f'relative to {root}')
    close = difflib.get_close_matches(osp.basename(name), [osp.basename(c) for c in configs], n=3)
    hint = f'; close names: {close}' if close else ''
    raise FileNotFoundError(f'no config {name!r} under {root}{hint}')


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m nala_mm.apis.config_path',
        description="Print the absolute path of one of nala_mm's configs (for a _base_ entry), "
                    'or the configs folder without NAME.')
    parser.add_argument('name', nargs='?', help='config basename, or path relative to the configs '
                                                'folder (e.g. demo/ade20k_demo_nala_upernet.py)')
    parser.add_argument('--list', action='store_true', help='list every config, relative paths')
    args = parser.parse_args(argv)
    try:
        if args.list:
            print('\n'.join(all_configs(configs_root())))
        else:
            print(config_path(args.name) if args.name else configs_root())
    except (FileNotFoundError, ValueError) as error:
        print(f'error: {error}', file=sys.stderr)
        sys.exit(2)


if __name__ == '__main__':
    main()
