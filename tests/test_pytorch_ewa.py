"""harness/frameworks/pytorch/ewa.py without TensorFlow: the detector's outputs, a few
training steps that fit two images, predictions packed as TensorFlow's ewa.predict packs
them, the ROI crop by hand. Its equality with the Keras detector (count, loss, detections, proposals,
crop): tests/test_ewa.py, where both frameworks are installed; a run: test_pytorch_run.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from harness.frameworks.pytorch import ewa as pt  # noqa: E402
from harness.workloads import Dataset, ewa  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return ewa.load(Dataset.parse("synthetic:40:32"), str(tmp_path_factory.mktemp("ewa")))


def test_roi_crop_by_hand():
    """Features v(y, x) = 10 y + x on a 3 x 4 map at stride 4: bilinear sampling of a linear
    function is exact. ROI (image) (2, 2, 10, 14) -> feature (0, 0, 2, 3); a 3 x 3 crop
    samples y in (0, 1, 2), x in (0, 1.5, 3): values 10 y + x. A ROI reaching past the map
    gives 0 at the points outside it."""
    y, x = np.meshgrid(np.arange(3.0), np.arange(4.0), indexing="ij")
    features = torch.tensor(10 * y + x, dtype=torch.float32)[None, None]
    rois = torch.tensor([[[2.0, 2.0, 10.0, 14.0], [-2.0, 2.0, 6.0, 14.0]]])
    crop = pt.roi_crop(features, rois, 4, 3)[0, 0]
    want = np.array([[10 * a + b for b in (0, 1.5, 3)] for a in (0, 1, 2)])
    np.testing.assert_allclose(crop[0].numpy(), want, atol=1e-5)
    # second ROI: feature y from -1 to 1: the first row of samples lies outside (0), then y = 0, 1
    np.testing.assert_allclose(crop[1].numpy(), np.vstack([np.zeros(3), want[:2]]), atol=1e-5)


def test_training_steps_fit_two_images(data):
    """The outputs by name and shape (faster_rcnn's), the ground truth among the training
    ROIs, no draws in evaluation; 30 SGD steps halve the loss on two images."""
    torch.manual_seed(3)
    model = pt.build_model(data)
    (x, gt), y = next(ewa.batches(data, np.arange(2), 2, training=False, seed=0))
    inputs, target = pt.inputs((x, gt), "cpu"), pt.targets(y, "cpu")
    cfg, out = ewa.config(data), model(inputs)
    a = len(cfg.anchors())
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "rpn_logits": (2, a), "rpn_deltas": (2, a, 4), "anchors": (1, a, 4), "rois": (2, cfg.rois, 4),
        "cls_logits": (2, cfg.rois, 5), "box_deltas": (2, cfg.rois, 4), "rpn_noise": (2, a), "roi_noise": (2, cfg.rois)}
    real = y[0, :, 0] >= 0
    np.testing.assert_allclose(out["rois"][0, -len(real):][real].numpy(), y[0, real, 1:])
    model.eval()
    assert not model(inputs)["rpn_noise"].any()
    model.train()
    # the head's loss trains the backbone through the ROI crop (crop_and_resize's gradient), not only the RPN's
    pt.loss_terms(target, model(inputs))["head_cls"].sum().backward()
    assert model.backbone[0][0].weight.grad.abs().sum() > 0 and model.rpn_cls.weight.grad is None
    model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        per_image = pt.loss(model(inputs), target)
        per_image.mean().backward()
        opt.step()
        losses.append(per_image.detach().numpy())
    assert losses[0].shape == (2,) and np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[0])


def test_predict_packs_the_best_detections_first(data):
    torch.manual_seed(4)
    model = pt.build_model(data)
    s = pt.predict(model, data, slice(2, 7), torch.device("cpu"))
    k = ewa.config(data).detections
    assert s.shape == (5, ewa.score_width(data)) == (5, 6 * k)
    rows = s.reshape(5, k, 6)
    real = rows[..., 1] > 0
    assert real.any() and (rows[~real] == 0).all()
    assert np.isin(rows[real][:, 0], [0, 1, 2, 3]).all() and (rows[real][:, 1] <= 1).all()
    assert (rows[..., 2:][real] >= 0).all() and (rows[real][:, 4] <= 32).all() and (rows[real][:, 5] <= 48).all()
    assert (np.diff(rows[..., 1], axis=1) <= 1e-6).all()
    np.testing.assert_allclose(pt.predict(model, data, slice(4, 5), torch.device("cpu")), s[2:3], atol=1e-5)
    assert 0.0 <= ewa.quality(pt.predict(model, data, slice(None), torch.device("cpu")), data) <= 1.0


def test_the_batchs_nms_is_each_images_nms_bit_for_bit():
    """Issue 67, item 9: the proposals' NMS takes one IoU tensor for the batch (one copy to
    the host, packed eight to a byte from a GPU; one of the kept indices back) where it took
    one an image. On the CPU it keeps exactly what `nms` keeps image by image, zero rows after
    (random boxes, some identical and some empty, scores with ties)."""
    g = torch.Generator().manual_seed(5)
    corner = torch.rand(3, 60, 2, generator=g) * 40
    boxes = torch.cat([corner, corner + torch.rand(3, 60, 2, generator=g) * 20], -1)
    boxes[:, 5] = boxes[:, 4]
    boxes[:, 7, 2:] = boxes[:, 7, :2]                                   # zero area
    scores = torch.round(torch.rand(3, 60, generator=g) * 8) / 8       # ties
    for keep, iou in ((10, 0.7), (60, 0.3), (80, 0.5)):
        each = torch.stack([pt._padded(b[pt.nms(b, s, keep, iou)], keep) for b, s in zip(boxes, scores)])
        assert torch.equal(pt.nms_each(boxes, scores, keep, iou), each)


def test_boolean_verdicts_pack_eight_to_a_byte_as_numpy_does():
    over = torch.rand(2, 5, 13, generator=torch.Generator().manual_seed(1)) > 0.5
    packed = pt.pack_bits(over)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 5, 2)
    assert np.array_equal(packed.numpy(), np.packbits(over.numpy(), axis=-1))
    assert np.array_equal(pt.host_bool(over), over.numpy())             # a CPU's: as it is
