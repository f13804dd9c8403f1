"""tools/benchmark.py: whole-model inference latency, images/s and peak memory on synthetic
input. The inference step is checked in process (segmentation and detection); the tool itself,
with its fresh measuring processes, writes the JSON the issue asks for (make test-extended)."""
import importlib.util
import json

import pytest
import torch

from tests.helpers import DEMO_DET_CFG, DEMO_SEG_CFG, REPO, run_tool

TOOL = REPO / 'tools' / 'benchmark.py'


@pytest.fixture(scope='module')
def tool():
    spec = importlib.util.spec_from_file_location('benchmark_tool', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case(**extra):
    return dict(dict(shape=[64, 96], batch=2, warmup=1, repeat=2, device='cpu', amp=False,
                     cfg_options={}), **extra)


def test_the_inference_step_runs_a_whole_segmentor_at_the_given_shape(tool):
    step, compile_seconds = tool.inference_step(DEMO_SEG_CFG, case())
    assert compile_seconds is None  # not compiled
    outputs = step()
    assert len(outputs) == 2
    assert all(o.pred_sem_seg.data.shape == (1, 64, 96) for o in outputs)
    assert all(o.seg_logits.data.shape == (6, 64, 96) for o in outputs)  # the demo's 6 classes


def test_the_inference_step_runs_a_whole_detector(tool):
    step, _ = tool.inference_step(DEMO_DET_CFG, case(shape=[128, 128], batch=1))
    outputs = step()
    (sample,) = outputs
    assert {'bboxes', 'scores', 'labels', 'masks'} <= set(sample.pred_instances.keys())
    assert sample.pred_instances.masks.shape[-2:] == (128, 128)


def test_a_time_case_returns_in_turn_timings_of_each_config(tool):
    result = tool.run_one_case(case(configs=[DEMO_SEG_CFG, DEMO_SEG_CFG], what='time'))
    first, second = result['times']['0'], result['times']['1']
    assert len(first['times_ms']) == len(second['times_ms']) == 2
    assert 0 < first['best_ms'] <= first['median_ms']
    assert second['ms_ratio'] > 0 and first['ms_ratio'] == 1


@pytest.mark.parametrize('argv, message', [
    (['CONFIG.py'], "config 'CONFIG.py' does not exist"),
    ([DEMO_SEG_CFG, '--shape', '0', '128'], '--shape must be at least 1, got 0'),
    ([DEMO_SEG_CFG, '--repeat', 'x'], "--repeat takes an integer, got 'x'"),
    ([DEMO_SEG_CFG, '--device', 'cuda'], 'sees no CUDA device'),
])
def test_bad_arguments_are_named(tool, capsys, argv, message):
    if '--device' in argv and torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    with pytest.raises(SystemExit):
        tool.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.extended
@pytest.mark.integration
def test_the_tool_writes_latency_fps_and_memory(tmp_path):
    out = tmp_path / 'F.json'
    log = run_tool(TOOL, 'configs/demo/ade20k_demo_nala_upernet.py', '--shape', '128', '128',
                   '--repeat', '3', '--device', 'cpu', '--out', out)
    result = json.loads(out.read_text())
    (model,) = result['models']
    latency = model['latency_ms']
    assert len(latency['all']) == 3 and 0 < latency['best'] <= latency['median']
    assert model['fps'] == pytest.approx(1000 / latency['median'])
    memory = model['memory_mib']
    # the fresh process holds the interpreter, torch, mmseg and the model: hundreds of MiB
    assert memory['peak_rss'] > 200 and 0 < memory['inference_peak'] < memory['peak_rss']
    assert result['shape'] == [128, 128] and result['batch'] == 1 and result['device_type'] == 'cpu'
    assert result['code'] and 'available_mib_at_start' in result
    assert f"{latency['median']:.1f}" in log


@pytest.mark.extended
@pytest.mark.integration
def test_compare_times_a_second_config_in_turns_and_prints_the_ratio(tmp_path):
    """NaLa in all stages against the demo's hybrid: the same model but for two stages' mixer,
    so the ratio is near 1 and both were measured."""
    out = tmp_path / 'compare.json'
    log = run_tool(TOOL, DEMO_SEG_CFG, '--shape', '96', '96', '--batch', '2', '--repeat', '3',
                   '--warmup', '1', '--compare', DEMO_SEG_CFG, '--out', out,
                   '--cfg-options', "model.backbone.mixers=['nala','nala','nala','nala']")
    result = json.loads(out.read_text())
    assert len(result['models']) == 2
    compare = result['compare']
    assert 0.3 < compare['latency_ratio'] < 3 and 0.3 < compare['fps_ratio'] < 3
    assert 0.5 < compare['memory_ratio'] < 2
    assert f"{compare['latency_ratio']:.2f} of the time" in log
