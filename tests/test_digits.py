"""The digits world's data: splits, captioned augmentation, videos, batches."""

import itertools

import numpy as np
import pytest
from scipy import ndimage

from jaxpipe.digits import VOCABULARY
from jaxpipe.digits import data as digits
from jaxpipe.digits.data import (
    DIM_INK,
    MOTION_NAMES,
    ImageDataset,
    VideoDataset,
    augment,
    batches,
    caption,
    load_images,
    make_videos,
    parse_caption,
    split_indices,
    translate,
)
from jaxpipe.nn.text import Tokenizer

TOKENIZER = Tokenizer(VOCABULARY)


def ink(x):
    """[-1, 1] pixels -> ink in [0, 1] (background 0), channel dropped."""
    return (np.asarray(x)[..., 0] + 1.0) / 2.0


def centroid(x):
    """Ink centroid (row, col) of each image ``(..., 16, 16, 1)``."""
    a = ink(x)
    mass = a.sum((-2, -1))
    idx = np.arange(a.shape[-1], dtype=np.float64)
    return (a * idx[:, None]).sum((-2, -1)) / mass, (a * idx).sum((-2, -1)) / mass


@pytest.fixture(scope="module")
def train():
    return load_images("train")


@pytest.fixture(scope="module")
def sample(train):
    """200 training digits, 20 of each."""
    images, labels = train
    index = np.concatenate([np.flatnonzero(labels == d)[:20] for d in range(10)])
    return images[index], labels[index]


# ------------------------------------------------------------------------------------------------ base images
def test_load_images_shapes_ranges_and_split_sizes(train):
    images, labels = train
    held_images, held_labels = load_images("heldout")
    assert images.shape == (1438, 16, 16, 1) and held_images.shape == (359, 16, 16, 1)
    assert images.dtype == np.float32 and labels.dtype == np.int32
    assert labels.shape == (1438,) and held_labels.shape == (359,)
    for x in (images, held_images):
        assert x.min() == -1.0 and x.max() <= 1.0
        assert (x == -1.0).mean() > 0.25  # background is exactly -1
        assert x.max(axis=(1, 2, 3)).min() > 0.0  # every digit has ink
    assert set(labels.tolist()) == set(range(10))


def test_splits_are_disjoint_fixed_and_stratified():
    train, heldout, every = (split_indices(s) for s in ("train", "heldout", "all"))
    assert len(np.intersect1d(train, heldout)) == 0
    np.testing.assert_array_equal(np.union1d(train, heldout), every)
    assert len(every) == 1797
    np.testing.assert_array_equal(split_indices("heldout"), heldout)  # fixed
    _, held_labels = load_images("heldout")
    _, all_labels = load_images("all")
    share = np.bincount(held_labels, minlength=10) / np.bincount(all_labels, minlength=10)
    assert np.all(np.abs(share - 0.2) < 0.01)
    other = split_indices("heldout", seed=1)
    assert not np.array_equal(other, heldout) and len(other) == len(heldout)


def test_upsampling_matches_the_sklearn_originals():
    from sklearn.datasets import load_digits

    original = load_digits().images / 16.0
    images, labels = load_images("all")
    np.testing.assert_array_equal(labels, load_digits().target)
    block_mean = ink(images).reshape(-1, 8, 2, 8, 2).mean((2, 4))  # back to 8x8
    # bilinear x2 (half-pixel centres, edge-clamped), then 2x2 means == a [1/8, 3/4, 1/8] blur per axis
    blur = original
    for axis in (1, 2):
        blur = ndimage.correlate1d(blur, [0.125, 0.75, 0.125], axis=axis, mode="nearest")
    np.testing.assert_allclose(block_mean, blur, atol=1e-5)


def test_load_images_is_cached_and_returns_copies(train):
    images, labels = load_images("train")
    images[:] = 0.0
    labels[:] = 0
    again, again_labels = load_images("train")
    np.testing.assert_array_equal(again, train[0])
    np.testing.assert_array_equal(again_labels, train[1])
    assert digits._base.cache_info().hits > 0


@pytest.mark.parametrize("split", ["test", "validation", ""])
def test_unknown_split_is_rejected(split):
    with pytest.raises(ValueError, match="unknown split .* allowed: train, heldout, all"):
        load_images(split)


# ------------------------------------------------------------------------------------------------ augmentation
def test_augment_shapes_labels_and_captions(sample):
    images, labels = sample
    data = augment(images, labels, seed=0)
    assert isinstance(data, ImageDataset) and len(data) == 200
    assert data.image.shape == (200, 16, 16, 1) and data.image.dtype == np.float32
    assert data.image.min() >= -1.0 and data.image.max() <= 1.0
    np.testing.assert_array_equal(data.digit, labels)
    for name, k in (("stroke", 2), ("position", 3), ("brightness", 2)):
        values = getattr(data, name)
        assert values.dtype == np.int32 and set(values.tolist()) == set(range(k)), name
    assert data.mentioned.shape == (200, 3) and data.mentioned.all()
    for i, text in enumerate(data.caption):
        assert text == caption(data.digit[i], data.stroke[i], data.position[i], data.brightness[i])
        assert len(text.split()) == 4
    assert "seven thick left bright" == caption(7, 1, 0, 1) == caption(7, "thick", "left", "bright")


def test_augment_is_deterministic_given_the_seed(sample):
    images, labels = sample
    a, b = augment(images, labels, seed=3, drop=0.5), augment(images, labels, seed=3, drop=0.5)
    c = augment(images, labels, seed=4, drop=0.5)
    for name, value in a.fields().items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(getattr(b, name)), err_msg=name)
    assert a.caption != c.caption
    assert not np.array_equal(a.image, c.image)


def test_copies_draw_independent_attributes(sample):
    images, labels = sample
    data = augment(images, labels, seed=0, copies=3)
    assert len(data) == 600
    np.testing.assert_array_equal(data.digit, np.tile(labels, 3))
    assert not np.array_equal(data.stroke[:200], data.stroke[200:400])


def test_thick_strokes_have_more_ink_than_thin(sample):
    images, labels = sample
    thin = augment(images, labels, seed=0, stroke="thin", brightness=1)
    thick = augment(images, labels, seed=0, stroke="thick", brightness=1)
    np.testing.assert_array_equal(thin.position, thick.position)  # fixing one attribute keeps the others' draws
    ratio = ink(thick.image).sum((1, 2)) / ink(thin.image).sum((1, 2))
    assert ratio.min() > 1.3 and np.median(ratio) > 1.8


def test_position_moves_the_ink_centroid(sample):
    images, labels = sample
    cx = [centroid(augment(images, labels, seed=0, position=p).image)[1] for p in range(3)]
    left, center, right = cx
    assert np.all(left < center - 1.5) and np.all(right > center + 1.5)
    assert np.all(left < 7.5) and np.all(right > 7.5)
    assert np.all(np.abs(center - 7.5) < 1.6)
    # the shift does not cut the digit: almost no ink in the outermost columns
    for p in (0, 2):
        a = ink(augment(images, labels, seed=0, position=p, stroke="thick").image)
        edge = a[:, :, [0, 15]].sum((1, 2)) / a.sum((1, 2))
        assert edge.max() < 0.03


def test_brightness_scales_the_ink(sample):
    images, labels = sample
    dim = augment(images, labels, seed=0, brightness="dim")
    bright = augment(images, labels, seed=0, brightness="bright")
    np.testing.assert_allclose(ink(bright.image).max((1, 2)), 1.0, atol=1e-6)
    np.testing.assert_allclose(ink(dim.image).max((1, 2)), DIM_INK, atol=1e-6)
    np.testing.assert_allclose(ink(dim.image), DIM_INK * ink(bright.image), atol=1e-6)  # same shape, less ink


def test_fixed_attributes_accept_arrays(sample):
    images, labels = sample
    position = np.arange(200) % 3
    data = augment(images, labels, seed=0, position=position, stroke=np.array(["thin", "thick"] * 100))
    np.testing.assert_array_equal(data.position, position)
    np.testing.assert_array_equal(data.stroke, np.arange(200) % 2)


def test_drop_makes_partial_prompts_in_fixed_order(sample):
    images, labels = sample
    everything = augment(images, labels, seed=0, drop=1.0)
    assert all(text == caption(d) for text, d in zip(everything.caption, everything.digit))
    assert not everything.mentioned.any()
    data = augment(images, labels, seed=0, drop={"position": 1.0, "brightness": 0.5}, copies=5)
    assert data.mentioned[:, 0].all() and not data.mentioned[:, 1].any()
    assert 0.4 < data.mentioned[:, 2].mean() < 0.6
    order = ("digit", "stroke", "position", "brightness")
    for i, text in enumerate(data.caption):
        parsed = parse_caption(text)
        named = [k for k in order if parsed[k] is not None]
        assert named == sorted(named, key=order.index)
        assert parsed["digit"] == data.digit[i] and parsed["stroke"] == data.stroke[i]
        assert (parsed["brightness"] is not None) == data.mentioned[i, 2]
        if parsed["brightness"] is not None:
            assert parsed["brightness"] == data.brightness[i]
    # the image does not depend on what the caption leaves out
    np.testing.assert_array_equal(everything.image, augment(images, labels, seed=0).image)


def test_all_captions_are_in_the_vocabulary(sample):
    images, labels = sample
    texts = list(augment(images, labels, seed=0, drop=0.3, copies=2).caption)
    texts += list(make_videos(images, labels, seed=0).caption)
    ids = TOKENIZER.encode(texts, 8, unknown="error")
    assert TOKENIZER.decode(ids) == texts


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seed=-1), "seed must be a non-negative int"),
        (dict(seed=0, stroke="bold"), "unknown stroke 'bold'; allowed: thin, thick"),
        (dict(seed=0, position=3), "position must be an int in 0..2"),
        (dict(seed=0, brightness=np.zeros(5, int)), r"brightness must be None, one label, or an array of shape"),
        (dict(seed=0, drop=1.5), r"drop probabilities must be in \[0, 1\]"),
        (dict(seed=0, drop={"digit": 0.5}), "drop has unknown attribute"),
        (dict(seed=0, copies=0), "copies must be an int >= 1"),
    ],
)
def test_augment_rejects_bad_arguments(sample, kwargs, message):
    with pytest.raises(ValueError, match=message):
        augment(*sample, **kwargs)


def test_augment_rejects_bad_images(sample):
    images, labels = sample
    with pytest.raises(ValueError, match=r"images must have shape \(N, 16, 16, 1\)"):
        augment(images[:, :8], labels, seed=0)
    with pytest.raises(ValueError, match="labels must have shape"):
        augment(images, labels[:5], seed=0)
    with pytest.raises(ValueError, match="labels must be integer digits in 0..9"):
        augment(images, labels + 5, seed=0)


def test_caption_and_parse_caption_round_trip_and_errors():
    assert caption(3, motion="up") == "three moving up" and caption(5, motion=4) == "five still"
    assert parse_caption("three moving up") == dict(digit=3, stroke=None, position=None, brightness=None, motion=2)
    assert parse_caption("seven thick left bright") == dict(digit=7, stroke=1, position=0, brightness=1, motion=None)
    assert parse_caption("Seven") == dict(digit=7, stroke=None, position=None, brightness=None, motion=None)
    with pytest.raises(ValueError, match="unknown digit 'ten'"):
        caption("ten")
    with pytest.raises(ValueError, match="motion must be an int in 0..4"):
        caption(1, motion=7)
    with pytest.raises(ValueError, match=r"unknown word\(s\) 'purple' in 'seven purple'"):
        parse_caption("seven purple")
    # every unknown word is named, with the closest words: a typo is not blamed on its neighbour
    with pytest.raises(ValueError, match=r"'rigth' \(did you mean 'right' or 'bright'\?\), 'purpel'"):
        parse_caption("seven moving rigth purpel")
    with pytest.raises(ValueError, match="cannot parse 'moving'"):
        parse_caption("seven moving")
    with pytest.raises(ValueError, match="no digit word"):
        parse_caption("thick left")
    with pytest.raises(ValueError, match="names the stroke twice"):
        parse_caption("seven thin thick")


# ------------------------------------------------------------------------------------------------ videos
@pytest.fixture(scope="module")
def videos(sample):
    images, labels = sample
    return make_videos(images, labels, seed=0, motion=np.arange(200) % 5)


def test_video_shapes_and_captions(videos, sample):
    assert isinstance(videos, VideoDataset) and len(videos) == 200
    assert videos.video.shape == (200, 8, 16, 16, 1) and videos.video.dtype == np.float32
    assert videos.video.min() >= -1.0 and videos.video.max() <= 1.0
    assert MOTION_NAMES == ("left", "right", "up", "down", "still")
    for text, d, m in zip(videos.caption, videos.digit, videos.motion):
        assert text == caption(d, motion=m)
        assert parse_caption(text)["motion"] == m
    assert "moving right" in videos.caption[1] and videos.caption[4].endswith(" still")
    # horizontal movers start on the side they move away from
    assert np.all(videos.position[videos.motion == 0] == 2) and np.all(videos.position[videos.motion == 1] == 0)


def test_video_motion_moves_the_centroid_in_the_captioned_direction(videos):
    cy, cx = centroid(videos.video)  # (N, T)
    dy, dx = cy[:, -1] - cy[:, 0], cx[:, -1] - cx[:, 0]
    step_y, step_x = np.diff(cy, axis=1), np.diff(cx, axis=1)
    m = videos.motion
    assert np.all(dx[m == 0] < -5) and np.all(dx[m == 1] > 5)
    assert np.all(dy[m == 2] < -4) and np.all(dy[m == 3] > 4)
    assert np.all(step_x[m == 0] < 0) and np.all(step_x[m == 1] > 0)  # every frame moves
    assert np.all(step_y[m == 2] < 0) and np.all(step_y[m == 3] > 0)
    assert np.all(np.abs(dy[m < 2]) < 0.5) and np.all(np.abs(dx[m >= 2]) < 0.5)
    still = videos.video[m == 4]
    np.testing.assert_array_equal(still, np.repeat(still[:, :1], 8, axis=1))


def test_video_first_frame_is_the_augmented_image(videos, sample):
    images, labels = sample
    image = augment(
        images, labels, seed=1, stroke=videos.stroke, position=videos.position, brightness=videos.brightness
    ).image
    lead = 3  # default: half of the 7 px of travel
    for m, shift in enumerate((0, 0, lead, -lead, 0)):
        sel = videos.motion == m
        np.testing.assert_array_equal(videos.video[sel, 0], translate(image[sel], shift, 0), err_msg=MOTION_NAMES[m])
    # frames are whole-pixel translations of the first, background filling in
    right = videos.motion == 1
    np.testing.assert_array_equal(videos.video[right, 3], translate(videos.video[right, 0], 0, 3))


def test_videos_are_deterministic_and_validate(sample):
    images, labels = sample
    a, b = make_videos(images, labels, seed=5), make_videos(images, labels, seed=5)
    c = make_videos(images, labels, seed=6)
    np.testing.assert_array_equal(a.video, b.video)
    assert a.caption == b.caption and a.caption != c.caption
    short = make_videos(images[:4], labels[:4], seed=0, motion="up", frames=3, speed=2, lead=0)
    assert short.video.shape == (4, 3, 16, 16, 1)
    np.testing.assert_array_equal(short.video[:, 2], translate(short.video[:, 0], -4, 0))
    with pytest.raises(ValueError, match="frames must be an int >= 1"):
        make_videos(images, labels, seed=0, frames=0)
    with pytest.raises(ValueError, match="unknown motion 'sideways'; allowed: left, right, up, down, still"):
        make_videos(images, labels, seed=0, motion="sideways")


def test_translate_fills_with_background_without_wrapping():
    x = np.full((1, 4, 4, 1), -1.0, np.float32)
    x[0, 0, 3, 0] = 1.0
    assert translate(x, 0, 1).max() == -1.0  # left the frame, no wrap-around
    y = translate(x, 2, -3)
    assert y[0, 2, 0, 0] == 1.0 and (y == 1.0).sum() == 1


# ------------------------------------------------------------------------------------------------ batches
def test_batches_are_fixed_size_shuffled_permutations(sample):
    data = augment(*sample, seed=0)
    got = list(batches(data, 64, seed=0, epochs=2))
    assert len(got) == 2 * (200 // 64)
    for batch in got:
        assert set(batch) == {"image", "caption", "digit", "stroke", "position", "brightness", "mentioned"}
        assert batch["image"].shape == (64, 16, 16, 1) and batch["digit"].shape == (64,)
        assert isinstance(batch["caption"], list) and len(batch["caption"]) == 64
    # rows stay aligned: each caption describes its own labels
    b = got[0]
    assert b["caption"][5] == caption(b["digit"][5], b["stroke"][5], b["position"][5], b["brightness"][5])
    # find each batch's rows in the dataset by the (unique) image bytes
    where = {row.tobytes(): i for i, row in enumerate(data.image)}
    epoch0 = np.concatenate([[where[r.tobytes()] for r in b["image"]] for b in got[:3]])
    epoch1 = np.concatenate([[where[r.tobytes()] for r in b["image"]] for b in got[3:]])
    for epoch in (epoch0, epoch1):
        assert len(set(epoch.tolist())) == 192  # no repeats within an epoch
    assert not np.array_equal(epoch0, np.arange(192))  # shuffled
    assert not np.array_equal(epoch0, epoch1)  # reshuffled per epoch


def test_batches_are_deterministic_and_endless_by_default(sample):
    data = augment(*sample, seed=0)
    a = list(batches(data, 50, seed=7, epochs=2))
    b = list(batches(data, 50, seed=7, epochs=2))
    c = list(batches(data, 50, seed=8, epochs=1))
    assert [x["caption"] for x in a] == [x["caption"] for x in b]
    assert a[0]["caption"] != c[0]["caption"]
    endless = list(itertools.islice(batches(data, 50, seed=7), 9))  # beyond two epochs
    assert len(endless) == 9 and endless[4]["caption"] == a[4]["caption"]


def test_batches_with_a_tokenizer_are_all_arrays(videos):
    batch = next(batches(videos, 16, seed=0, tokenizer=TOKENIZER, max_len=8))
    assert "caption" not in batch and batch["ids"].shape == (16, 8) and batch["ids"].dtype == np.int32
    assert batch["video"].shape == (16, 8, 16, 16, 1) and batch["motion"].shape == (16,)
    assert all(isinstance(v, np.ndarray) for v in batch.values())
    for text, d, m in zip(TOKENIZER.decode(batch["ids"]), batch["digit"], batch["motion"]):
        assert text == caption(d, motion=m)


@pytest.mark.parametrize(
    "batch_size, kwargs, message",
    [
        (0, {}, "batch_size must be a positive int"),
        (-3, {}, "batch_size must be a positive int"),
        (201, {}, "batch_size 201 exceeds the dataset's 200 samples"),
        (8, dict(epochs=-1), "epochs must be None"),
    ],
)
def test_batches_reject_bad_arguments(sample, batch_size, kwargs, message):
    data = augment(*sample, seed=0)
    with pytest.raises(ValueError, match=message):
        next(batches(data, batch_size, seed=0, **kwargs))


def test_batches_reject_non_datasets():
    with pytest.raises(ValueError, match="dataset must be an ImageDataset or VideoDataset"):
        next(batches({"image": np.zeros((4, 16, 16, 1))}, 2, seed=0))


def test_take_selects_aligned_rows(sample):
    data = augment(*sample, seed=0)
    part = data.take(np.array([3, 1]))
    assert isinstance(part, ImageDataset) and len(part) == 2
    assert part.caption == (data.caption[3], data.caption[1])
    np.testing.assert_array_equal(part.image, data.image[[3, 1]])
    assert len(data.take(data.position == 0)) == int((data.position == 0).sum())
    assert "ImageDataset(n=200" in repr(data)


def test_split_prompt_gives_each_stage_its_words():
    from jaxpipe.digits import split_prompt

    assert split_prompt("seven thick moving right") == ("seven thick left", "seven moving right")
    assert split_prompt("seven thick moving left") == ("seven thick right", "seven moving left")
    assert split_prompt("seven center moving right") == ("seven center", "seven moving right")
    assert split_prompt("three dim moving up") == ("three dim", "three moving up")
    assert split_prompt("five bright") == ("five bright", None)
    with pytest.raises(ValueError, match="vocabulary"):
        split_prompt("seven purple")
