"""ShardedSegmentor: UperNet on an all-NaLa NaLaFormer predicts one image split across 2 gloo
ranks as one process predicts it whole."""
import copy

import pytest
import torch

from nala_mm.parallel.segmentor import ShardedSegmentor
from tests.helpers import rel_err, run_ranks

SHAPE = (2, 3, 100, 72)  # 4 blocks of 32 rows: 64 and 36 rows
# momentum None: one training-mode pass sets the running statistics to its batch's, so the
# prediction is as well scaled as a trained model's (at their initial values the activations are
# unnormalised and float32 rounding alone moves the logits by 1.3e-5 of one process's float64)
BN = dict(type='SyncBN', momentum=None)


def upernet():
    from mmengine.config import ConfigDict
    from mmseg.models.segmentors import EncoderDecoder
    from mmseg.utils import register_all_modules

    import nala_mm  # noqa: F401  (registers NaLaFormer)
    register_all_modules(init_default_scope=True)
    return EncoderDecoder(
        backbone=dict(type='NaLaFormer', mixers=('nala',) * 4, norm_cfg=BN,
                      arch=dict(embed_dims=(16, 16, 24, 24), depths=(1, 1, 1, 1),
                                num_heads=(1, 1, 2, 2), mlp_ratios=(2, 2, 2, 2))),
        decode_head=dict(type='UPerHead', in_channels=[16, 16, 24, 24], in_index=[0, 1, 2, 3],
                         pool_scales=(1, 2, 3), channels=16, num_classes=3,
                         norm_cfg=BN, align_corners=False,
                         loss_decode=dict(type='CrossEntropyLoss')),
        test_cfg=ConfigDict(mode='whole'))


def samples():
    from mmseg.structures import SegDataSample
    height, width = SHAPE[2:]
    return [SegDataSample(metainfo=dict(ori_shape=(height, width), img_shape=(height, width),
                                        pad_shape=(height, width), padding_size=[0, 0, 0, 0]))
            for _ in range(SHAPE[0])]


def predict_sharded(rank: int, world: int, path: str) -> None:
    case = torch.load(path, weights_only=False)
    model = upernet()
    model.load_state_dict(case['state'])
    predictions = ShardedSegmentor(model.eval()).predict(case['x'], samples())
    if rank == 0:
        torch.save([p.seg_logits.data for p in predictions], f'{path}.sharded')
    else:
        assert predictions is None


@pytest.mark.extended
@pytest.mark.integration
def test_sharded_prediction_is_the_one_process_prediction(tmp_path):
    torch.manual_seed(0)
    model = upernet()
    x = torch.randn(SHAPE)
    with torch.no_grad():
        model.train()._forward(x)
    state = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        expected = [p.seg_logits.data for p in model.eval().predict(x, samples())]
    path = str(tmp_path / 'case.pt')
    torch.save(dict(state=state, x=x), path)
    run_ranks(predict_sharded, 2, tmp_path, path)
    for logits, one_process in zip(torch.load(f'{path}.sharded'), expected):
        assert logits.shape == (3, *SHAPE[2:])
        assert rel_err(logits, one_process) < 1e-5
        assert torch.equal(logits.argmax(0), one_process.argmax(0))
