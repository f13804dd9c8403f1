"""The evaluators the tools report with (mmdet's ``CocoMetric``, mmseg's ``IoUMetric``) against
independent computations on inputs with a known answer: the ground truth itself (a perfect score)
and a perturbed copy whose score is computed here (pycocotools run directly; a numpy confusion
matrix). The tool tests compare numbers with these evaluators; this is why those numbers mean
what they say."""
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from tests.helpers import coco_evaluate

CLASSES = ('disc', 'square', 'triangle', 'star')  # the synthetic COCO data's categories


# ------------------------------------------------------------------------------------------
# detection: CocoMetric vs pycocotools

def perturbed_detections(anns):
    """Ground-truth instances as detections (xyxy box, class index, score, annotation), with
    one triangle dropped, one star box shifted, one disc labelled as a star; scores distinct,
    so the ranking is unambiguous."""
    dets = []
    by_cat = {}
    for ann in anns:
        by_cat.setdefault(ann['category_id'], []).append(ann)
    dropped = by_cat[3][-1]['id']   # a triangle: its category keeps one of its two instances
    shifted = by_cat[4][0]['id']    # a star: box moved by a fifth of its width
    relabelled = by_cat[1][0]['id']  # a disc, reported as a star
    for rank, ann in enumerate(anns):
        if ann['id'] == dropped:
            continue
        x, y, w, h = ann['bbox']
        dx = round(w / 5) if ann['id'] == shifted else 0
        label = CLASSES.index('star') if ann['id'] == relabelled else ann['category_id'] - 1
        dets.append(dict(ann=ann, box=[x + dx, y, x + dx + w, y + h], label=label,
                         score=0.9 - 0.05 * rank, dx=dx))
    return dets


def exact_detections(anns):
    return [dict(ann=ann, box=[ann['bbox'][0], ann['bbox'][1], ann['bbox'][0] + ann['bbox'][2],
                               ann['bbox'][1] + ann['bbox'][3]],
                 label=ann['category_id'] - 1, score=1.0, dx=0) for ann in anns]


def gt_mask(coco, det):
    mask = coco.annToMask(det['ann']).astype(bool)
    return np.roll(mask, det['dx'], axis=1)


def mmdet_coco_metric(ann_file, coco, dets, metric):
    """mmdet's CocoMetric (as the tools configure it) on ``dets``."""
    from mmdet.evaluation import CocoMetric
    evaluator = CocoMetric(ann_file=str(ann_file), metric=metric, classwise=True)
    evaluator.dataset_meta = dict(classes=CLASSES)
    samples = []
    for img in coco.dataset['images']:
        mine = [d for d in dets if d['ann']['image_id'] == img['id']]
        pred = dict(bboxes=torch.tensor([d['box'] for d in mine], dtype=torch.float32),
                    scores=torch.tensor([d['score'] for d in mine], dtype=torch.float32),
                    labels=torch.tensor([d['label'] for d in mine], dtype=torch.int64))
        if 'segm' in metric:
            pred['masks'] = torch.from_numpy(np.stack([gt_mask(coco, d) for d in mine]))
        samples.append(dict(img_id=img['id'], ori_shape=(img['height'], img['width']),
                            pred_instances=pred))
    evaluator.process({}, samples)
    return evaluator.evaluate(len(samples))


def pycocotools_ap(coco, dets, iou_type):
    """COCO AP of ``dets`` with pycocotools alone: xyxy -> xywh, class index -> category id by
    name, masks to RLE; mmdet's max-dets (100, 300, 1000). Returns (mAP, mAP_50, per-class)."""
    cat_id = {cat['name']: cat['id'] for cat in coco.dataset['categories']}
    results = []
    for d in dets:
        x1, y1, x2, y2 = (float(np.float32(v)) for v in d['box'])
        res = dict(image_id=d['ann']['image_id'], category_id=cat_id[CLASSES[d['label']]],
                   score=float(np.float32(d['score'])))
        if iou_type == 'bbox':
            res['bbox'] = [x1, y1, x2 - x1, y2 - y1]
        else:
            rle = mask_utils.encode(np.asfortranarray(gt_mask(coco, d).astype(np.uint8)))
            rle['counts'] = rle['counts'].decode()
            res['segmentation'] = rle
        results.append(res)
    evaluation = coco_evaluate(coco, results, iou_type, [cat_id[name] for name in CLASSES])
    precision = evaluation.eval['precision'][:, :, :, 0, -1]  # [iou, recall, class], all areas
    per_class = {}
    for k, name in enumerate(CLASSES):
        p = precision[:, :, k]
        per_class[name] = float(np.mean(p[p > -1])) if (p > -1).any() else None
    return evaluation.stats[0], evaluation.stats[1], per_class


@pytest.fixture(scope='module')
def coco_gt(tiny_coco):
    ann_file = tiny_coco / 'annotations' / 'instances_val2017.json'
    coco = COCO(str(ann_file))
    anns = sorted(coco.dataset['annotations'], key=lambda a: a['id'])
    # detections are built with class index = category id - 1
    assert [(c['id'], c['name']) for c in coco.dataset['categories']] == list(
        enumerate(CLASSES, start=1))
    counts = {c: sum(a['category_id'] == c for a in anns) for c in (1, 3, 4)}
    # the perturbations need two triangles, and at least two discs and stars
    assert counts[3] == 2 and counts[1] >= 2 and counts[4] >= 2, counts
    return ann_file, coco, anns


@pytest.mark.parametrize('iou_type', ['bbox', 'segm'])
def test_coco_metric_on_the_ground_truth_is_a_perfect_score(coco_gt, iou_type):
    ann_file, coco, anns = coco_gt
    metrics = mmdet_coco_metric(ann_file, coco, exact_detections(anns), iou_type)
    assert metrics[f'coco/{iou_type}_mAP'] == 1.0
    assert metrics[f'coco/{iou_type}_mAP_50'] == 1.0
    assert metrics[f'coco/{iou_type}_mAP_75'] == 1.0


@pytest.mark.parametrize('iou_type', ['bbox', 'segm'])
def test_coco_metric_on_perturbed_detections_equals_pycocotools(coco_gt, iou_type):
    ann_file, coco, anns = coco_gt
    dets = perturbed_detections(anns)
    metrics = mmdet_coco_metric(ann_file, coco, dets, iou_type)
    ap, ap50, per_class = pycocotools_ap(coco, dets, iou_type)
    assert 0.2 < ap < 0.9 and 0 < ap50 < 1
    # mmdet rounds to 3 decimals
    assert metrics[f'coco/{iou_type}_mAP'] == round(ap, 3)
    assert metrics[f'coco/{iou_type}_mAP_50'] == round(ap50, 3)
    # known without any evaluator: one of two triangles found exactly, the other missed, so
    # precision 1 at recall <= 0.5 and 0 beyond: 51 of COCO's 101 recall points, at every IoU
    assert per_class['triangle'] == pytest.approx(51 / 101, abs=1e-12)
    assert metrics['coco/triangle_precision'] == round(51 / 101, 3)
    for name in ('disc', 'star'):
        assert metrics[f'coco/{name}_precision'] == round(per_class[name], 3)


# ------------------------------------------------------------------------------------------
# segmentation: IoUMetric vs a numpy confusion matrix

SEG_CLASSES = ('wall', 'floor', 'windowpane', 'plant', 'painting', 'lamp')


def numpy_scores(preds, gts, num, ignore=255):
    """aAcc, mIoU and mAcc (%) from a confusion matrix over all images' labelled pixels; the
    mean IoU runs over classes in ground truth or prediction, mAcc over classes in ground
    truth."""
    confusion = np.zeros((num, num), dtype=np.int64)
    for pred, gt in zip(preds, gts):
        valid = gt != ignore
        confusion += np.bincount(num * gt[valid] + pred[valid],
                                 minlength=num * num).reshape(num, num)
    tp = np.diag(confusion)
    gt_area, pred_area = confusion.sum(1), confusion.sum(0)
    union = gt_area + pred_area - tp
    iou = tp[union > 0] / union[union > 0]
    acc = tp[gt_area > 0] / gt_area[gt_area > 0]
    return 100 * tp.sum() / confusion.sum(), 100 * iou.mean(), 100 * acc.mean()


def mmseg_iou_metric(preds, gts):
    from mmseg.evaluation import IoUMetric
    evaluator = IoUMetric(iou_metrics=['mIoU'])
    evaluator.dataset_meta = dict(classes=SEG_CLASSES)
    evaluator.process({}, [dict(pred_sem_seg=dict(data=torch.from_numpy(p)[None]),
                                gt_sem_seg=dict(data=torch.from_numpy(g)[None]))
                           for p, g in zip(preds, gts)])
    return evaluator.evaluate(len(preds))


@pytest.fixture
def label_maps():
    """Three 48 x 64 ground-truth maps of blocks of classes 0..4 (class 5 never occurs), with
    an unlabelled (255) border."""
    rng = np.random.default_rng(22)
    gts = []
    for _ in range(3):
        gt = np.kron(rng.integers(0, 5, size=(6, 8)), np.ones((8, 8), dtype=np.int64))
        gt[:, :3] = 255
        gts.append(gt)
    return gts


def test_iou_metric_on_the_ground_truth_is_a_perfect_score(label_maps):
    preds = [np.where(gt == 255, 0, gt) for gt in label_maps]
    metrics = mmseg_iou_metric(preds, label_maps)
    assert metrics == {'aAcc': 100.0, 'mIoU': 100.0, 'mAcc': 100.0}


def test_iou_metric_on_a_perturbed_copy_equals_numpy(label_maps):
    rng = np.random.default_rng(7)
    preds = []
    for gt in label_maps:
        pred = np.where(gt == 255, 0, gt)
        # a tenth of the pixels relabelled at random, class 5 (absent from the ground truth)
        # among them; what lands on the unlabelled border must not count
        flip = rng.random(gt.shape) < 0.1
        pred[flip] = rng.integers(0, 6, size=flip.sum())
        pred[:, :3] = rng.integers(0, 6, size=(gt.shape[0], 3))
        preds.append(pred)
    metrics = mmseg_iou_metric(preds, label_maps)
    a_acc, miou, macc = numpy_scores(preds, label_maps, len(SEG_CLASSES))
    assert 50 < miou < 95
    # mmseg rounds to 2 decimals (of a float32: equal to its precision, 1e-5 at this size)
    assert metrics['mIoU'] == pytest.approx(round(miou, 2), abs=1e-4)
    assert metrics['aAcc'] == pytest.approx(round(a_acc, 2), abs=1e-4)
    assert metrics['mAcc'] == pytest.approx(round(macc, 2), abs=1e-4)
    # the unlabelled border counts nowhere: the maps cropped to the labelled part score the same
    assert mmseg_iou_metric([p[:, 3:] for p in preds], [g[:, 3:] for g in label_maps]) == metrics
