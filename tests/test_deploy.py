"""Deployment: the export path computes what the fast path does, and tools/export_onnx.py writes
ONNX graphs that ONNX Runtime runs to within 1e-4 of PyTorch, at sizes other than the export's."""
import importlib.util
import inspect
import os
import os.path as osp
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from nala_mm.models import LinearAttention, NaLaFormer, NormAwareLinearAttention, SoftmaxAttention
from nala_mm.models import attention as attention_module

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
DET_DEMO = osp.join(REPO, 'configs', 'demo', 'coco_demo_nala_mask-rcnn.py')
FPN_T = osp.join(REPO, 'configs', 'ade20k_nala-t_fpn.py')
TINY = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 4),
            mlp_ratios=(2, 2, 2, 2))
HYBRID, ALL_LINEAR = ('nala', 'nala', 'softmax', 'softmax'), ('nala',) * 4
TOLERANCE = 1e-4  # the tool's acceptance threshold (relative L2)


def rel_err(actual, expected) -> float:
    actual, expected = (torch.as_tensor(t, dtype=torch.float64) for t in (actual, expected))
    return ((actual - expected).norm() / expected.norm()).item()


def tool_env() -> dict:
    return dict(os.environ, PYTHONPATH=REPO, PYTHONWARNINGS='ignore')


def run_export_tool(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, 'tools/export_onnx.py', *args], cwd=REPO,
                          env=env or tool_env(), capture_output=True, text=True, timeout=600)


def reported_errors(stdout: str):
    """``{(H, W): {output: relative L2 error}}`` from the tool's report."""
    found = {}
    for shape, errors in re.findall(r'input \(\d+, 3, (\d+, \d+)\): relative L2 error ([^;]+);',
                                    stdout):
        size = tuple(int(v) for v in shape.split(', '))
        found[size] = {name: float(err) for name, err in
                       (item.split() for item in errors.split(', '))}
    return found


def need_onnx_runtime():
    for name in ('onnx', 'onnxscript', 'onnxruntime'):
        pytest.importorskip(name, reason=f'{name} missing: pip install -e .[deploy]')


# ----------------------------------------------------------------------------- the export path
@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
@pytest.mark.parametrize('attn_types', [HYBRID, ALL_LINEAR], ids=['hybrid', 'all-linear'])
def test_backbone_on_the_export_path_matches_the_fast_path(kernel, attn_types, monkeypatch):
    torch.manual_seed(0)
    model = NaLaFormer(arch=TINY, attn_types=attn_types, kernel=kernel).eval()
    x = torch.randn(1, 3, 45, 61)  # odd token counts in every stage
    with torch.no_grad():
        fast = model(x)

    def not_while_exporting(*args, **kwargs):
        raise AssertionError('complex RoPE or the RoPE cache was used while exporting')

    kernelized_attention = attention_module.kernelized_attention

    def plain_ops_only(*args, **kwargs):
        mode = inspect.signature(kernelized_attention).bind(*args, **kwargs).arguments['mode']
        assert mode == 'reference', f'attention mode {mode!r} while exporting'
        return kernelized_attention(*args, **kwargs)

    monkeypatch.setattr(attention_module, 'is_exporting', lambda: True)
    monkeypatch.setattr(attention_module, 'kernelized_attention', plain_ops_only)
    for name in ('rope_phasor', 'apply_rope', '_cached_rope'):
        monkeypatch.setattr(attention_module, name, not_while_exporting)
    with torch.no_grad():
        exported = model(x)
    for i, (a, e) in enumerate(zip(exported, fast)):
        assert rel_err(a, e) <= 1e-5, f'stage {i}'


@pytest.mark.parametrize('layer_cls', [NormAwareLinearAttention, LinearAttention,
                                       SoftmaxAttention])
def test_torch_export_takes_the_export_path_with_dynamic_sizes(layer_cls):
    torch.manual_seed(0)
    layer = layer_cls(16, 2).eval()
    dim = torch.export.Dim.DYNAMIC
    program = torch.export.export(layer, (torch.randn(1, 6, 8, 16),),  # channels-last tokens
                                  dynamic_shapes=({1: dim, 2: dim},))
    ops = {str(node.target) for node in program.graph.nodes if node.op == 'call_function'}
    assert not [op for op in ops if 'complex' in op or 'PythonOp' in op], ops
    x = torch.randn(1, 7, 11, 16)  # another size: the RoPE table is built in the graph
    with torch.no_grad():
        assert rel_err(program.module()(x), layer(x)) <= 1e-5


# ----------------------------------------------------------------------------- the tool
@pytest.fixture(scope='module')
def exports(tmp_path_factory):
    """The demo segmentor exported with dynamic H, W from a checkpoint, and the demo detector's
    backbone through the legacy exporter; both tool runs at once (an export is mostly one busy
    Python thread)."""
    need_onnx_runtime()
    from nala_mm.analysis import build_model_from_config
    work = tmp_path_factory.mktemp('export')
    torch.manual_seed(0)
    segmentor, _ = build_model_from_config(SEG_DEMO)  # hybrid NaLa/softmax + UperNet, 6 classes
    torch.save(dict(state_dict=segmentor.state_dict()), work / 'seg.pth')
    runs = dict(
        seg=[SEG_DEMO, '--checkpoint', str(work / 'seg.pth'), '--shape', '64', '64', '--dynamic'],
        det=[DET_DEMO, '--backbone-only', '--shape', '64', '96', '--dynamic',
             '--exporter', 'torchscript'])
    procs = {}
    for name, args in runs.items():
        with open(work / f'{name}.log', 'w') as log:  # a file: a full pipe would block the tool
            procs[name] = subprocess.Popen(
                [sys.executable, 'tools/export_onnx.py', *args, '--out', str(work / f'{name}.onnx'),
                 '--repeats', '1'], cwd=REPO, env=tool_env(), stdout=log,
                stderr=subprocess.STDOUT, text=True)
    logs = {}
    for name, proc in procs.items():
        proc.wait(timeout=600)
        logs[name] = (work / f'{name}.log').read_text()
        assert proc.returncode == 0, f'{name} export failed:\n{logs[name][-3000:]}'
    return dict(work=work, segmentor=segmentor, logs=logs)


def test_tool_exports_a_dynamic_segmentor_that_onnx_runtime_runs_at_other_sizes(exports):
    import onnx
    import onnxruntime
    errors = reported_errors(exports['logs']['seg'])
    assert set(errors) == {(64, 64), (77, 93)}, exports['logs']['seg']  # 77, 93: no stride divides
    assert all(err['seg_logits'] <= TOLERANCE for err in errors.values()), errors

    out = str(exports['work'] / 'seg.onnx')
    graph = onnx.load(out).graph
    assert [i.name for i in graph.input] == ['input']
    assert [o.name for o in graph.output] == ['seg_logits']
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims[:2] == [1, 3] and all(isinstance(d, str) for d in dims[2:]), dims

    # independently of the tool's own check: the checkpoint's model here, a third size
    session = onnxruntime.InferenceSession(out, providers=['CPUExecutionProvider'])
    images = torch.randn(1, 3, 50, 83)
    (logits,) = session.run(['seg_logits'], {'input': images.numpy()})
    with torch.no_grad():
        expected = exports['segmentor'].encode_decode(images, [dict(img_shape=images.shape[2:])])
    assert logits.shape == (1, 6, 50, 83)
    assert rel_err(logits, expected) <= TOLERANCE


def test_tool_exports_the_backbone_of_a_detection_config(exports):
    import onnxruntime
    errors = reported_errors(exports['logs']['det'])
    assert set(errors) == {(64, 96), (77, 125)}, exports['logs']['det']
    for size_errors in errors.values():
        assert sorted(size_errors) == ['stage0', 'stage1', 'stage2', 'stage3']
        assert max(size_errors.values()) <= TOLERANCE, errors
    session = onnxruntime.InferenceSession(str(exports['work'] / 'det.onnx'),
                                           providers=['CPUExecutionProvider'])
    assert [o.name for o in session.get_outputs()] == ['stage0', 'stage1', 'stage2', 'stage3']
    features = session.run(None, {'input': np.random.randn(1, 3, 77, 125).astype(np.float32)})
    # the demo detector's widths at strides 4..32, sizes rounded up
    assert [f.shape for f in features] == [(1, 32, 20, 32), (1, 64, 10, 16), (1, 128, 5, 8),
                                           (1, 192, 3, 4)]


def test_semantic_fpn_exports_with_dynamic_sizes(tmp_path):
    """FPN's head upsamples by a factor; mmseg computes that size in Python, which a trace would
    bake in (relative error 5e-2 at the second size without the swap)."""
    need_onnx_runtime()
    spec = importlib.util.spec_from_file_location('export_onnx',
                                                  osp.join(REPO, 'tools', 'export_onnx.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    small = {'model.backbone.arch': dict(TINY, _delete_=True),
             'model.neck.in_channels': list(TINY['embed_dims']), 'model.neck.out_channels': 16,
             'model.decode_head.in_channels': [16] * 4, 'model.decode_head.channels': 16,
             'model.decode_head.num_classes': 3}
    torch.manual_seed(0)
    module, names = tool.build_exportable(FPN_T, cfg_options=small)
    path = str(tmp_path / 'fpn.onnx')
    # the legacy exporter: seconds instead of a minute, and it bakes Python sizes in the same way
    tool.export(module, torch.randn(1, 3, 64, 64), path, names, dynamic=True,
                exporter='torchscript')
    session = tool.ort_session(path)
    for size in ((64, 64), (77, 93)):
        images = torch.randn(1, 3, *size)
        (logits,) = session.run(names, {'input': images.numpy()})
        with torch.no_grad():
            expected = module(images)
        assert logits.shape == (1, 3, *size)
        assert rel_err(logits, expected) <= TOLERANCE, size


def test_tool_names_a_missing_checkpoint(tmp_path):
    missing = tmp_path / 'nowhere' / 'iter_160000.pth'
    proc = run_export_tool(SEG_DEMO, '--checkpoint', str(missing), '--shape', '64', '64',
                           '--out', str(tmp_path / 'x.onnx'))
    assert proc.returncode == 2
    assert f'checkpoint file not found: {missing}' in proc.stderr
    assert not (tmp_path / 'x.onnx').exists()


def test_tool_says_what_to_install_without_onnx_runtime(tmp_path):
    shadow = tmp_path / 'shadow' / 'onnxruntime'
    shadow.mkdir(parents=True)
    (shadow / '__init__.py').write_text('raise ImportError("hidden by the test")\n')
    proc = run_export_tool(SEG_DEMO, '--shape', '64', '64', '--out', str(tmp_path / 'x.onnx'),
                           env=tool_env() | dict(PYTHONPATH=f'{shadow.parent}{os.pathsep}{REPO}'))
    assert proc.returncode == 2
    assert 'needs onnxruntime' in proc.stderr and 'pip install -e .[deploy]' in proc.stderr
