"""Deployment: the export path computes what the fast path does, and :mod:`nala_mm.apis.export`
(with its command line tools/export_onnx.py) writes ONNX graphs that ONNX Runtime runs to within
1e-4 of PyTorch, at sizes other than the export's."""
import os
import os.path as osp
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.autograd.function import BackwardCFunction
from torch.utils._python_dispatch import TorchDispatchMode

from nala_mm.apis.export import (
    DEFAULT_TOLERANCE,
    ExportableAdaptiveAvgPool2d,
    ExportableUpsample,
    build_exportable,
    check_sizes,
    export,
    make_exportable,
    ort_session,
)
from nala_mm.models import (
    DEFAULT_HYBRID,
    LinearAttention,
    NaLaFormer,
    NormAwareLinearAttention,
    SoftmaxAttention,
)
from nala_mm.ops import is_exporting
from tests.helpers import REPO, rel_err, tool_env
from tests.helpers import TINY_ARCH as TINY

SEG_DEMO = osp.join(REPO, 'configs', 'demo', 'ade20k_demo_nala_upernet.py')
DET_DEMO = osp.join(REPO, 'configs', 'demo', 'coco_demo_nala_mask-rcnn.py')
FPN_T = osp.join(REPO, 'configs', 'ade20k_nala-t_fpn.py')
ALL_LINEAR = ('nala',) * 4
TOLERANCE = DEFAULT_TOLERANCE  # the tool's acceptance threshold (relative L2)
integration = pytest.mark.integration  # starts processes


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


class ComplexOps(TorchDispatchMode):
    """Records the ops that produce a complex tensor (the fast RoPE rotates with complex
    numbers, which ONNX does not have)."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.is_complex()
               for t in (out if isinstance(out, (tuple, list)) else (out,))):
            self.seen.add(str(func))
        return out


def custom_autograd_nodes(outputs) -> set:
    """Names of the ``torch.autograd.Function`` nodes (the fast paths) in the graph of
    ``outputs``."""
    found, seen = set(), set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, BackwardCFunction):
            found.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


# ----------------------------------------------------------------------------- the export path
@pytest.mark.parametrize('kernel', ['cosine', 'relu'])
@pytest.mark.parametrize('pattern', [DEFAULT_HYBRID, ALL_LINEAR], ids=['hybrid', 'all-linear'])
def test_backbone_on_the_export_path_matches_the_fast_path(kernel, pattern, monkeypatch):
    torch.manual_seed(0)
    nala = dict(type='NormAwareLinearAttention', kernel=kernel)
    model = NaLaFormer(arch=TINY, mixers=tuple(nala if m == 'nala' else m for m in pattern))
    model.eval()
    x = torch.randn(1, 3, 45, 61)  # odd token counts in every stage
    fast = model(x)
    # every fast op of the block: attention (its readout; the state op behind it), LePE and
    # downsample convs, FFN
    assert custom_autograd_nodes(fast) == {
        f'GeneratedBackwardFor_nala_mm_{op}_defaultBackward'
        for op in ('kernelized_state', 'kernelized_readout', 'conv2d', 'gelu_conv')}

    # what every op sees while torch.export or the dynamo ONNX exporter traces
    monkeypatch.setattr(torch.compiler, 'is_exporting', lambda: True)
    assert is_exporting()
    with ComplexOps() as complex_ops:
        exported = model(x)
    assert not complex_ops.seen, f'complex RoPE while exporting: {complex_ops.seen}'
    assert not custom_autograd_nodes(exported), custom_autograd_nodes(exported)
    for i, (a, e) in enumerate(zip(exported, fast)):
        assert rel_err(a.detach(), e.detach()) <= 1e-5, f'stage {i}'


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


# ----------------------------------------------------------------------------- size-following twins
@pytest.mark.parametrize('output_size', [1, 2, 3, 6, (2, None)])
def test_exportable_adaptive_pool_matches_pytorch_at_every_size(output_size):
    pool, twin = torch.nn.AdaptiveAvgPool2d(output_size), ExportableAdaptiveAvgPool2d(output_size)
    for height, width in ((6, 6), (7, 13), (17, 5)):
        x = torch.randn(2, 3, height, width)
        torch.testing.assert_close(twin(x), pool(x), rtol=1e-5, atol=1e-6)


def test_make_exportable_swaps_in_place_and_keeps_the_outputs():
    from mmseg.models.utils import Upsample
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(3),
                                Upsample(scale_factor=2, mode='bilinear', align_corners=False),
                                Upsample(size=(5, 5), mode='nearest'))  # a fixed size: kept
    x = torch.randn(1, 2, 9, 12)
    expected = model(x)
    assert make_exportable(model) == 2
    assert isinstance(model[0], ExportableAdaptiveAvgPool2d) and isinstance(model[2], Upsample)
    torch.testing.assert_close(model(x), expected)


def test_check_sizes_adds_one_that_no_stride_divides_for_dynamic_graphs():
    assert check_sizes(64, 96, dynamic=False) == [(64, 96)]
    size, second = check_sizes(64, 96, dynamic=True)
    assert size == (64, 96) and all(v % 2 for v in second), second


# ----------------------------------------------------------------------------- the tool
@pytest.fixture(scope='module')
def exports(tmp_path_factory):
    """The demo segmentor exported with dynamic H, W from a checkpoint, and the demo detector's
    backbone through the legacy exporter; both tool runs at once (an export is mostly one busy
    Python thread)."""
    need_onnx_runtime()
    from nala_mm.apis.config_loading import build_model_from_config
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


@pytest.mark.extended
@integration
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
    assert rel_err(torch.from_numpy(logits), expected) <= TOLERANCE


@pytest.mark.extended
@integration
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
    bake in: only the exportable copy follows the runtime size."""
    need_onnx_runtime()
    small = {'model.backbone.arch': dict(TINY, _delete_=True),
             'model.neck.in_channels': list(TINY['embed_dims']), 'model.neck.out_channels': 16,
             'model.decode_head.in_channels': [16] * 4, 'model.decode_head.channels': 16,
             'model.decode_head.num_classes': 3}
    torch.manual_seed(0)
    module, names = build_exportable(FPN_T, cfg_options=small)
    path = str(tmp_path / 'fpn.onnx')
    # the legacy exporter: quicker to export, and it bakes Python sizes in the same way
    export(module, torch.randn(1, 3, 64, 64), path, names, dynamic=True, exporter='torchscript')
    assert not [m for m in module.modules() if isinstance(m, ExportableUpsample)]  # a copy swapped
    session = ort_session(path)
    for size in ((64, 64), (77, 93)):
        images = torch.randn(1, 3, *size)
        (logits,) = session.run(names, {'input': images.numpy()})
        with torch.no_grad():
            expected = module(images)
        assert logits.shape == (1, 3, *size)
        assert rel_err(torch.from_numpy(logits), expected) <= TOLERANCE, size


@pytest.mark.parametrize('config, cfg_options', [
    ('ade20k_segformer_mit-b0_nala-s12.py', {}),
    # Swin narrowed to keep the test quick; windowed stages 3-4 stay in the graph
    ('coco_swin-t_mask-rcnn_1x_nala-s12.py',
     {'model.backbone.embed_dims': 32, 'model.backbone.num_heads': [1, 2, 4, 8],
      'model.backbone.depths': [1, 1, 2, 1], 'model.neck.in_channels': [32, 64, 128, 256]}),
    # a narrow 4-layer DeiT with its class token; the last layer keeps the stock attention
    ('ade20k_deit-s_upernet_nala-all.py',
     {'model.backbone.embed_dims': 64, 'model.backbone.num_heads': 2,
      'model.backbone.num_layers': 4, 'model.backbone.out_indices': [0, 1, 2, 3],
      'model.backbone.mixers': ['nala', 'nala', 'nala', 'softmax'],
      'model.pretrained': None})])
def test_swapped_stock_backbones_export(config, cfg_options, tmp_path):
    """--backbone-only of a configs/swap/ config: NaLa stages and the stock attention stages
    (Swin's shifted windows, MiT's spatial reduction, ViT's global softmax) in one graph, within
    1e-4 in ORT."""
    need_onnx_runtime()
    module, names = build_exportable(osp.join(REPO, 'configs', 'swap', config),
                                     backbone_only=True, cfg_options=cfg_options)
    path = str(tmp_path / 'backbone.onnx')
    images = torch.randn(1, 3, 96, 128)
    export(module, images, path, names, dynamic=False, exporter='torchscript')
    outputs = ort_session(path).run(names, {'input': images.numpy()})
    with torch.no_grad():
        expected = module(images)
    assert len(outputs) == 4
    for actual, reference in zip(outputs, expected):
        assert rel_err(torch.from_numpy(actual), reference) <= TOLERANCE


@pytest.mark.extended
@integration
def test_tool_names_a_missing_checkpoint(tmp_path):
    missing = tmp_path / 'nowhere' / 'iter_160000.pth'
    proc = run_export_tool(SEG_DEMO, '--checkpoint', str(missing), '--shape', '64', '64',
                           '--out', str(tmp_path / 'x.onnx'))
    assert proc.returncode == 2
    assert f'checkpoint file not found: {missing}' in proc.stderr
    assert not (tmp_path / 'x.onnx').exists()


@pytest.mark.extended
@integration
def test_tool_says_what_to_install_without_onnx_runtime(tmp_path):
    shadow = tmp_path / 'shadow' / 'onnxruntime'
    shadow.mkdir(parents=True)
    (shadow / '__init__.py').write_text('raise ImportError("hidden by the test")\n')
    proc = run_export_tool(SEG_DEMO, '--shape', '64', '64', '--out', str(tmp_path / 'x.onnx'),
                           env=tool_env() | dict(PYTHONPATH=f'{shadow.parent}{os.pathsep}{REPO}'))
    assert proc.returncode == 2
    assert 'needs onnxruntime' in proc.stderr and 'pip install -e .[deploy]' in proc.stderr
