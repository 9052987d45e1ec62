"""The ImageNet pipeline: uint8 crops from the loader workers, normalised in batches on the device,
with Goyal's augmentation distribution and the per-sample seeding kept."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Subset
from torchvision import transforms
from torchvision.transforms import functional as TF

from lbsgd import data, train
from lbsgd.config import Config, ConfigError
from lbsgd.data import fake_files, folders, prefetch
from lbsgd.environment import dataset_digest


@pytest.fixture(scope="module")
def tiny_imagenet(tmp_path_factory):
    """12 train and 6 val JPEGs of 80x60 in 3 classes; 32x32 crops keep the tests fast."""
    root = tmp_path_factory.mktemp("imagenet")
    fake_files.write_imagenet(root, train=12, val=6, classes=3, size=(80, 60))
    return root, folders.imagenet(root, image_size=32)


def test_items_are_uint8_and_val_is_resize_centre_crop(tiny_imagenet):
    root, (train, val, classes, size) = tiny_imagenet
    assert (classes, size) == (3, 32)
    x, label = train[0]
    assert x.dtype == torch.uint8 and x.shape == (3, 32, 32)
    # val by hand: shorter side 60 -> int(32 * 256 / 224) = 36, 80x60 -> 48x36 (PIL bilinear);
    # centre crop 32 at rows 2..34, columns 8..40
    path, label = val.samples[4]
    image = Image.open(path).convert("RGB").resize((48, 36), Image.BILINEAR)
    expected = torch.from_numpy(np.asarray(image)[2:34, 8:40].transpose(2, 0, 1).copy())
    assert torch.equal(val[4][0], expected) and val[4][1] == label


def test_batches_are_normalised_like_torchvision_normalize(tiny_imagenet):
    _, (_, val, _, _) = tiny_imagenet
    idx = torch.arange(len(val))
    (x, y), *_ = data.batches(val, [idx], device=torch.device("cpu"))
    raw = torch.stack([val[i][0] for i in range(len(val))])
    reference = transforms.Normalize(folders.IMAGENET_MEAN, folders.IMAGENET_STD)(raw / 255.0)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x, reference, atol=1e-5, rtol=0)
    assert y.tolist() == [val[i][1] for i in range(len(val))]


def test_random_resized_crop_parameters_cover_goyal_scale_and_aspect_ranges(tiny_imagenet):
    """Goyal et al. §5.1 (Szegedy et al. 2015): crop area a uniform 8%-100% of the image, aspect
    ratio log-uniform in [3/4, 4/3]. Over 2,000 per-sample seeds on an ImageNet-sized image the
    drawn parameters stay inside those ranges and reach both ends."""
    _, (train, _, _, _) = tiny_imagenet
    crop, flip = train.transform.transforms[:2]
    assert isinstance(crop, transforms.RandomResizedCrop)
    assert isinstance(flip, transforms.RandomHorizontalFlip) and flip.p == 0.5
    image = Image.new("RGB", (500, 375))
    areas, aspects = [], []
    for seed in data.sample_seeds(3, torch.arange(2000)).tolist():
        torch.manual_seed(seed)
        _, _, h, w = crop.get_params(image, crop.scale, crop.ratio)
        areas.append(h * w / (500 * 375))
        aspects.append(w / h)
    areas_t, log_aspects = torch.tensor(areas), torch.tensor(aspects).log()
    assert areas_t.min() >= 0.08 - 0.01 and areas_t.max() <= 1.0
    assert areas_t.min() < 0.1 and areas_t.max() > 0.9  # both ends reached
    # uniform over [0.08, 1] where accepted: the median near the middle (0.54), not at an end
    assert 0.4 < areas_t.median() < 0.65
    bound = math.log(4 / 3) + 0.02  # rounding h and w to pixels moves the ratio a little
    assert log_aspects.abs().max() <= bound
    assert log_aspects.min() < -0.25 and log_aspects.max() > 0.25  # log(4/3) = 0.288


def test_each_sample_is_the_crop_and_flip_drawn_from_its_seed_and_flips_half(tiny_imagenet):
    """The item the loader yields for a seed is RandomResizedCrop's parameters then the flip drawn
    from that seed, applied to the decoded image: the distribution tested above is the one the
    pipeline uses, and about half of the samples are mirrored."""
    _, (train, _, _, _) = tiny_imagenet
    crop = train.transform.transforms[0]
    seeds = data.sample_seeds(5, torch.arange(400)).tolist()
    flips = []
    image = Image.open(train.samples[0][0]).convert("RGB")
    for k, seed in enumerate(seeds):
        torch.manual_seed(seed)
        top, left, h, w = crop.get_params(image, crop.scale, crop.ratio)
        flips.append(bool(torch.rand(1) < 0.5))
        if k < 20:  # the full pipeline on a few seeds (decoding 400 times adds nothing)
            expected = TF.resized_crop(image, top, left, h, w, [32, 32])
            if flips[-1]:
                expected = TF.hflip(expected)
            (x, _), *_ = data.batches(
                Subset(train, [0]), [torch.tensor([0])], seeds=[torch.tensor([seed])]
            )
            assert torch.equal(x[0], TF.pil_to_tensor(expected))
    assert 0.42 < sum(flips) / len(flips) < 0.58  # 400 fair coin flips: sd 0.025


def _uint8_stream(train, idx, seeds, workers, start=0):
    """uint8 batches (Subset hides ``on_device``: what the workers hand over) of stream positions
    ``start`` onwards, batches of 4."""
    batches = data.batches(
        Subset(train, range(len(train))),
        idx[start:].split(4),
        workers,
        seeds=seeds[start:].split(4),
    )
    return torch.cat([x for x, _ in batches])


def test_same_stream_positions_give_the_same_uint8_batches_with_0_and_2_workers_and_after_resume(
    tiny_imagenet,
):
    _, (train, _, _, _) = tiny_imagenet
    idx = torch.arange(len(train)).repeat(2)  # each image at two places of the stream
    seeds = data.sample_seeds(11, torch.arange(len(idx)))
    serial = _uint8_stream(train, idx, seeds, 0)
    assert serial.dtype == torch.uint8 and serial.shape == (24, 3, 32, 32)
    assert torch.equal(serial, _uint8_stream(train, idx, seeds, 2))
    assert torch.equal(serial[8:], _uint8_stream(train, idx, seeds, 2, start=8))  # resumed at 8
    # the same image at another place of the stream gets another crop
    assert sum(not torch.equal(serial[i], serial[i + 12]) for i in range(12)) >= 10


def test_normalise_refuses_float_batches():
    norm = prefetch.Normalise(folders.IMAGENET_MEAN, folders.IMAGENET_STD)
    with pytest.raises(ValueError, match="uint8"):
        norm(torch.zeros(2, 3, 4, 4))


@pytest.mark.cuda
def test_cuda_prefetch_gives_the_cpu_batches(tiny_imagenet):
    """Copied one batch ahead on a side stream and normalised on the GPU: the same batches as
    normalised on the host (to float32 rounding)."""
    _, (train, _, _, _) = tiny_imagenet
    idx = torch.arange(len(train)).split(4)
    seeds = data.sample_seeds(1, torch.arange(len(train))).split(4)
    host = list(data.batches(train, idx, 2, seeds=seeds, device=torch.device("cpu")))
    gpu = list(data.batches(train, idx, 2, seeds=seeds, device=torch.device("cuda")))
    assert len(gpu) == len(host)
    for (xg, yg), (xh, yh) in zip(gpu, host, strict=True):
        assert xg.is_cuda and yg.is_cuda
        torch.testing.assert_close(xg.cpu(), xh, atol=1e-5, rtol=0)
        assert torch.equal(yg.cpu(), yh)


def test_held_out_images_use_the_val_transform_and_the_rest_keep_the_augmentation(tiny_imagenet):
    """holdout on a file dataset: the held-out part of train/ is read as val/ is (resize, centre
    crop), the train part keeps Goyal's random crop and flip; both keep the batch normalisation
    (``on_device``), and the train part's digest is its own file list."""
    _, (train, val, classes, size) = tiny_imagenet
    s = data.hold_out(data.Splits(train, val, classes, size), 4, "imagenet")
    val_idx, train_idx = data.holdout_indices(12, 4)
    assert (len(s.train), len(s.val)) == (8, 4)
    assert s.val.indices == val_idx.tolist() and s.train.indices == train_idx.tolist()
    for i, j in enumerate(val_idx.tolist()):
        path, label = train.samples[j]
        expected = val.transform(Image.open(path).convert("RGB"))
        assert torch.equal(s.val[i][0], expected) and s.val[i][1] == label
    assert s.train.dataset is train and train.transform is not val.transform  # train untouched
    torch.manual_seed(0)
    a = s.train[0][0]
    torch.manual_seed(1)
    assert not torch.equal(a, s.train[0][0])  # a random crop
    assert s.val.on_device is train.on_device and s.train.on_device is train.on_device
    (x, _), *_ = data.batches(s.val, [torch.arange(4)], device=torch.device("cpu"))
    assert x.dtype == torch.float32  # normalised where it trains
    digest = dataset_digest(s.train)
    assert digest["over"] == "files" and digest["samples"] == 8
    assert digest["sha1"] != dataset_digest(train)["sha1"]


def test_a_holdout_of_the_whole_train_folder_is_refused_in_one_line_before_training(
    tiny_imagenet, tmp_path
):
    """A file dataset's size is known once its folder is read: refused when it is built, before
    the run writes anything."""
    root, _ = tiny_imagenet
    cfg = Config(
        dataset="imagenet",
        data_dir=str(root),
        holdout=12,
        device="cpu",
        threads=1,
        wandb="disabled",
        out_dir=str(tmp_path / "out"),
    )
    with pytest.raises(ConfigError) as err:
        train(cfg)
    message = str(err.value)
    assert message.startswith("holdout=12 must be less than the train split's size, imagenet's 12")
    assert "valid: 0 to 11" in message and "\n" not in message
    assert not (tmp_path / "out").exists()
