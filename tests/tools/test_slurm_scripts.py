"""tools/slurm_train.sh and slurm_test.sh follow OpenMMLab's convention: PARTITION JOB_NAME
CONFIG WORK_DIR|CHECKPOINT, GPUS / GPUS_PER_NODE / CPUS_PER_TASK / SRUN_ARGS from the
environment, one task per GPU running the tool with --launcher=slurm. A stand-in srun records
the command it would run."""
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration
SCRIPTS = ('tools/slurm_train.sh', 'tools/slurm_test.sh', 'tools/dist_train.sh',
           'tools/dist_test.sh')


@pytest.mark.parametrize('script', SCRIPTS)
def test_scripts_are_executable_and_parse(script):
    path = REPO / script
    assert os.access(path, os.X_OK)
    assert subprocess.run(['bash', '-n', str(path)]).returncode == 0


def srun_argv(tmp_path, script, *args, **env) -> list:
    fake = tmp_path / 'bin'
    fake.mkdir(exist_ok=True)
    (fake / 'srun').write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    (fake / 'srun').chmod(0o755)
    run_env = dict(os.environ, PATH=f'{fake}:{os.environ["PATH"]}', **env)
    proc = subprocess.run(['bash', str(REPO / script), *args], capture_output=True, text=True,
                          env=run_env)
    assert proc.returncode == 0, proc.stderr
    return (tmp_path / 'argv').read_text().splitlines()


def test_slurm_train_runs_one_task_per_gpu_with_the_slurm_launcher(tmp_path):
    argv = srun_argv(tmp_path, 'tools/slurm_train.sh', 'part', 'job', 'configs/x.py', 'work',
                     '--amp', '--cfg-options', 'a=1', GPUS='16', GPUS_PER_NODE='8',
                     CPUS_PER_TASK='4', SRUN_ARGS='--quotatype=auto --exclusive')
    assert argv[:8] == ['-p', 'part', '--job-name=job', '--gres=gpu:8', '--ntasks=16',
                        '--ntasks-per-node=8', '--cpus-per-task=4', '--kill-on-bad-exit=1']
    assert argv[8:10] == ['--quotatype=auto', '--exclusive']
    tool = argv.index(str(REPO / 'tools' / 'train.py'))
    assert argv[tool + 1:] == ['configs/x.py', '--work-dir=work', '--launcher=slurm', '--amp',
                               '--cfg-options', 'a=1']


def test_slurm_test_passes_the_checkpoint_and_defaults_to_8_gpus(tmp_path):
    argv = srun_argv(tmp_path, 'tools/slurm_test.sh', 'part', 'job', 'configs/x.py', 'ckpt.pth',
                     '--tta')
    assert '--ntasks=8' in argv and '--gres=gpu:8' in argv and '--cpus-per-task=5' in argv
    tool = argv.index(str(REPO / 'tools' / 'test.py'))
    assert argv[tool + 1:] == ['configs/x.py', 'ckpt.pth', '--launcher=slurm', '--tta']


def test_fewer_than_8_gpus_fit_on_one_node(tmp_path):
    argv = srun_argv(tmp_path, 'tools/slurm_train.sh', 'p', 'j', 'c.py', 'w', GPUS='2')
    assert '--ntasks=2' in argv and '--ntasks-per-node=2' in argv and '--gres=gpu:2' in argv


@pytest.mark.parametrize('script', ['tools/slurm_train.sh', 'tools/slurm_test.sh'])
def test_missing_arguments_print_the_usage(script):
    proc = subprocess.run(['bash', str(REPO / script), 'part'], capture_output=True, text=True)
    assert proc.returncode == 2 and 'usage:' in proc.stderr and 'PARTITION JOB_NAME' in proc.stderr


@pytest.mark.parametrize('tool, argv', [('train.py', ['c.py', '--work-dir=w']),
                                         ('test.py', ['c.py', 'ckpt.pth'])])
def test_the_tools_parse_what_the_scripts_pass(monkeypatch, tool, argv):
    spec = importlib.util.spec_from_file_location(f'tool_{tool[:-3]}', REPO / 'tools' / tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, 'argv', [tool, *argv, '--launcher=slurm'])
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    args = module.parse_args()
    assert args.launcher == 'slurm' and args.config == 'c.py'
