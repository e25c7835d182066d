"""Measured quality (C4) of the digits-world generators, judged by the ``digit-scorer`` card (the reward) and,
for images, by the independent evaluators too (``evaluators``: ``digit-classifier`` and the readers).

Text-to-image: the fraction of images the scorer classifies as the prompted digit (for plain
digit prompts and for full compositional prompts), the accuracy of each prompted attribute, and
the fraction with every prompted attribute right. Image-to-video: the fraction of videos whose
ink centroid moves in the prompted direction, and how closely frame 0 matches the conditioning
image.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer
from jaxpipe.digits.evaluators import Evaluator, default_evaluator
from jaxpipe.generate import generate
from jaxpipe.progress import progress_bar
from jaxpipe.stopping import Stopped

__all__ = [
    "t2i_quality",
    "i2v_quality",
    "t2v_quality",
    "understanding_quality",
    "thinking_quality",
    "ink_centroids",
    "moves_as_told",
    "MOTION_THRESHOLD_PX",
    "FIRST_FRAME_TOLERANCE",
]

MOTION_THRESHOLD_PX = 1.0
"""A video 'moves' in a direction when its centroid travels more than this many pixels that way."""

FIRST_FRAME_TOLERANCE = 0.1
"""Frame 0 'matches' the conditioning image when their mean absolute difference (in [0, 1]) is below this."""


def _in_batches(fn, n: int, batch: int, bar=None, should_stop: Callable[[], bool] | None = None):
    """``fn(slice)`` over ``n`` items in batches, concatenated; advances ``bar`` by each batch; raises
    ``Stopped`` between batches once ``should_stop()`` is true."""
    parts = []
    for i in range(0, n, batch):
        if should_stop is not None and should_stop():
            raise Stopped()
        parts.append(np.asarray(fn(slice(i, min(i + batch, n)))))
        if bar is not None:
            bar.update(min(i + batch, n) - i)
    return np.concatenate(parts)


def _denoise_defaults(card: Card):
    """The settings of the card's first sampling loop (``denoise``, ``chunk_rollout``, ...): what
    ``num_steps=None`` / ``guidance=None`` mean."""
    return next(
        card.spec.loop(lp).config
        for lp in card.spec.recipe
        if hasattr(card.spec.loop(lp).config, "num_steps") and hasattr(card.spec.loop(lp).config, "guidance")
    )


def t2i_quality(
    t2i: Card,
    scorer: Card,
    *,
    samples: int = 200,
    seed: int = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 100,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
    evaluator: Evaluator | None = None,
) -> dict:
    """Accuracy of ``samples`` random prompts (digit and attributes drawn uniformly), each rendered twice
    (plain digit and full compositional prompt), judged by the scorer and, under ``"independent"``, by
    ``evaluator`` (default ``evaluators.default_evaluator()``: the ``digit-classifier`` and the readers).
    ``progress``: a bar over the images; ``should_stop()`` is checked between batches (``Stopped`` is
    raised when it turns true).

    Args:
        t2i: a text-to-image card.
        scorer: a ``digit-scorer`` card.
        samples: random prompts (each rendered twice).
        seed: the seed of the prompts (or picks) and of the generation seeds (``seed * 100_003 + i`` for item ``i``).
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: items generated per call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.
        evaluator: the independent judge (default: ``evaluators.default_evaluator()``).

    Returns:
        ``{"samples", "num_steps", "guidance", "digit_accuracy", "digit_accuracy_compositional",
        "attribute_accuracy": {attribute: float}, "all_attributes_correct", "independent": {the same four}}``,
        accuracies in ``[0, 1]`` (``digit_accuracy``: on the plain-digit prompts; the rest: on the full ones).

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    if samples <= 0:
        raise ValueError(f"samples must be > 0 (got {samples})")
    rng = np.random.default_rng(seed)
    labels = {
        "digit": rng.integers(0, 10, samples),
        **{name: rng.integers(0, len(words), samples) for name, words in digits.ATTRIBUTE_WORDS.items()},
    }
    attrs = digits.ATTRIBUTES
    full = [digits.caption(*(int(labels[k][i]) for k in ("digit",) + attrs)) for i in range(samples)]
    plain = [digits.caption(int(d)) for d in labels["digit"]]

    def render(prompts, bar):
        return _in_batches(
            lambda s: generate(
                t2i,
                prompts[s],
                seed=[seed * 100_003 + i for i in range(s.start, s.stop)],
                num_steps=num_steps,
                guidance=guidance,
            )["image"],
            samples,
            batch,
            bar,
            should_stop,
        )

    with progress_bar(total=2 * samples, desc=f"{t2i.model_id} images", disable=not progress) as bar:
        plain_images, full_images = render(plain, bar), render(full, bar)
    judge = evaluator or default_evaluator()
    readers = {
        "scorer": lambda images: {
            k: np.asarray(v) for k, v in digit_scorer.predict(scorer, images * 2.0 - 1.0).items()
        },
        "independent": judge.read,
    }
    summaries = {}
    for name, read in readers.items():
        plain_read, full_read = read(plain_images), read(full_images)
        right = {k: full_read[k] == labels[k] for k in ("digit",) + attrs}
        summaries[name] = {
            "digit_accuracy": float(np.mean(plain_read["digit"] == labels["digit"])),
            "digit_accuracy_compositional": float(np.mean(right["digit"])),
            "attribute_accuracy": {k: float(np.mean(right[k])) for k in attrs},
            "all_attributes_correct": float(np.mean(np.all([right[k] for k in right], axis=0))),
        }
    return {
        "samples": samples,
        "num_steps": num_steps or _denoise_defaults(t2i).num_steps,
        "guidance": guidance or _denoise_defaults(t2i).guidance,
        **summaries["scorer"],
        "independent": summaries["independent"],
    }


def ink_centroids(video: np.ndarray) -> np.ndarray:
    """Ink centroids ``(..., T, 2)`` as (row, col) of videos ``(..., T, H, W, 1)`` in [0, 1] (background 0).

    Args:
        video: videos ``(..., T, H, W, 1)`` in ``[0, 1]``, background 0 (negative values count as no ink).

    Returns:
        The centroids, float64 ``(..., T, 2)``, in px from the top-left pixel's centre.
    """
    ink = np.clip(np.asarray(video, np.float64)[..., 0], 0.0, None)
    h, w = ink.shape[-2:]
    mass = ink.sum(axis=(-2, -1)) + 1e-8
    rows = (ink * np.arange(h)[:, None]).sum(axis=(-2, -1)) / mass
    cols = (ink * np.arange(w)[None, :]).sum(axis=(-2, -1)) / mass
    return np.stack([rows, cols], axis=-1)


def moves_as_told(displacement: np.ndarray, motion: np.ndarray) -> np.ndarray:
    """``(N,)`` bool: centroid ``displacement`` ``(N, 2)`` (dy, dx in px) moved as ``motion`` ``(N,)`` (indices of
    ``digits.MOTION_NAMES``) says: more than ``MOTION_THRESHOLD_PX`` that way, or less than it for ``still``.

    Args:
        displacement: the centroid's travel, ``(N, 2)`` as (dy, dx) in px (e.g. last frame minus first).
        motion: the prompted motions, ``(N,)`` int indices of ``digits.MOTION_NAMES``.

    Returns:
        ``(N,)`` bool (False for an unknown motion index).
    """
    dy, dx = displacement[:, 0], displacement[:, 1]
    t = MOTION_THRESHOLD_PX
    checks = {
        0: dx < -t,  # left
        1: dx > t,  # right
        2: dy < -t,  # up
        3: dy > t,  # down
        4: np.hypot(dx, dy) < t,  # still
    }
    return np.select([motion == m for m in checks], [checks[m] for m in checks], False)


def i2v_quality(
    i2v: Card,
    scorer: Card | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 50,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
    evaluator: Evaluator | None = None,
) -> dict:
    """Motion, first-frame fidelity and identity of ``samples`` videos conditioned on real held-out digits
    (``progress``, ``should_stop`` and ``evaluator`` as in ``t2i_quality``).

    The reference is the ideal video (the conditioning frame translated as prompted), so
    ``video_mae`` measures how well the digit keeps its shape while it moves; with a ``scorer``,
    ``last_frame_digit_accuracy`` is how often the last frame still reads as the prompted digit (and, under
    ``"independent"``, how often ``evaluator``'s classifier reads it so).

    Args:
        i2v: an image-to-video card.
        scorer: a ``digit-scorer`` card (``None``: no digit accuracies).
        samples: videos, each conditioned on a different held-out digit (at most the split's 359).
        seed: the seed of the prompts (or picks) and of the generation seeds (``seed * 100_003 + i`` for item ``i``).
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: items generated per call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.
        evaluator: the independent judge, used with a ``scorer`` (default: ``evaluators.default_evaluator()``).

    Returns:
        ``{"samples", "num_steps", "guidance", "motion_accuracy", "motion_accuracy_by_direction": {motion: float},
        "first_frame_mae", "first_frame_match", "video_mae"}``, plus with a ``scorer``
        ``"last_frame_digit_accuracy"`` and ``"independent": {"last_frame_digit_accuracy"}``; errors in ink units.

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    if samples <= 0:
        raise ValueError(f"samples must be > 0 (got {samples})")
    images, labels = digits.load_images("heldout")
    pick = np.random.default_rng(seed).permutation(len(images))[:samples]
    reference = digits.make_videos(images[pick], labels[pick], seed=seed)
    first = (reference.video[:, 0] + 1.0) / 2.0
    prompts = list(reference.caption)
    with progress_bar(total=len(prompts), desc=f"{i2v.model_id} videos", disable=not progress) as bar:
        videos = _in_batches(
            lambda s: generate(
                i2v,
                prompts[s],
                image=first[s],
                seed=[seed * 100_003 + i for i in range(s.start, s.stop)],
                num_steps=num_steps,
                guidance=guidance,
            )["video"],
            len(prompts),
            batch,
            bar,
            should_stop,
        )
    centroids = ink_centroids(videos)
    ok = moves_as_told(centroids[:, -1] - centroids[:, 0], reference.motion)
    frame_error = np.abs(videos[:, 0] - first).mean(axis=(1, 2, 3))
    ideal = (reference.video + 1.0) / 2.0
    extra = {}
    if scorer is not None:
        last = digit_scorer.predict(scorer, videos[:, -1] * 2.0 - 1.0)["digit"]
        extra["last_frame_digit_accuracy"] = float(np.mean(np.asarray(last) == reference.digit))
        independent = (evaluator or default_evaluator()).predict(videos[:, -1])
        extra["independent"] = {"last_frame_digit_accuracy": float(np.mean(independent == reference.digit))}
    per_motion = {
        name: float(np.mean(ok[reference.motion == m]))
        for m, name in enumerate(digits.MOTION_NAMES)
        if np.any(reference.motion == m)
    }
    return {
        "samples": len(prompts),
        "num_steps": num_steps or _denoise_defaults(i2v).num_steps,
        "guidance": guidance or _denoise_defaults(i2v).guidance,
        "motion_accuracy": float(np.mean(ok)),
        "motion_accuracy_by_direction": per_motion,
        "first_frame_mae": float(np.mean(frame_error)),
        "first_frame_match": float(np.mean(frame_error < FIRST_FRAME_TOLERANCE)),
        "video_mae": float(np.mean(np.abs(videos - ideal))),
        **extra,
    }


def _parsed(texts) -> dict[str, np.ndarray]:
    """Labels ``{"digit", *ATTRIBUTES: (N,) int}`` named by caption ``texts`` (-1: not named, or unparseable)."""
    keys = ("digit",) + digits.ATTRIBUTES
    out = {k: np.full(len(texts), -1) for k in keys}
    for i, text in enumerate(texts):
        try:
            labels = digits.parse_caption(text)
        except ValueError:
            continue
        for k in keys:
            if labels[k] is not None:
                out[k][i] = labels[k]
    return out


def understanding_quality(
    card: Card,
    *,
    samples: int = 200,
    seed: int = 0,
    batch: int = 100,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """Image -> caption accuracy of a card with an ``understand`` program on ``samples`` held-out digits
    drawn with random attributes: per attribute (the caption names the right word), all right, and
    how often the caption is complete (digit and every attribute named once).

    Args:
        card: a card whose family has an ``understand`` program (``bagel-mot``).
        samples: held-out digits to caption (at most the split's 359).
        seed: the seed of the picks, their renders and the generation seeds (``0..samples - 1``).
        batch: images captioned per call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``{"samples", "accuracy": {"digit", attribute: float}, "all_right", "complete", "examples"}``
        (``examples``: the first 5 captions).

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    if samples <= 0:
        raise ValueError(f"samples must be > 0 (got {samples})")
    program = registry.family_of(card).program("understand")
    images, labels = digits.load_images("heldout")
    pick = np.random.default_rng(seed).permutation(len(images))[:samples]
    data = digits.augment(images[pick], labels[pick], seed=seed)
    pixels = (data.image + 1.0) / 2.0
    texts: list[str] = []
    with progress_bar(total=samples, desc=f"{card.model_id} captions", disable=not progress) as bar:
        for i in range(0, samples, batch):
            if should_stop is not None and should_stop():
                raise Stopped()
            part = slice(i, min(i + batch, samples))
            n = part.stop - part.start
            texts += generate(
                card, [""] * n, image=pixels[part], seed=list(range(part.start, part.stop)), program=program
            )["caption_text"]
            bar.update(n)
    said = _parsed(texts)
    keys = ("digit",) + digits.ATTRIBUTES
    right = {k: said[k] == np.asarray(getattr(data, k)) for k in keys}
    return {
        "samples": samples,
        "accuracy": {k: float(np.mean(right[k])) for k in keys},
        "all_right": float(np.mean(np.all([right[k] for k in keys], axis=0))),
        "complete": float(np.mean(np.all([said[k] >= 0 for k in keys], axis=0))),
        "examples": texts[:5],
    }


def thinking_quality(
    card: Card,
    scorer: Card,
    *,
    samples: int = 200,
    seed: int = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 100,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """Thinking vs not on partial prompts, judged by ``scorer``.

    Partial prompts are caption prefixes (the digit, then stroke, then position: 1 to 3 of the 4
    caption words, uniformly), the partial captions the card learned to complete. For each of
    ``samples`` prompts the same seed renders with ``inputs={"think": True}`` and ``False``.
    Reported per mode: the prompted digit right, every named attribute right, both right; with
    thinking also how often the thought is a complete caption that keeps the prompt, and how often
    the image shows everything the thought names (the model follows its own plan).

    Args:
        card: a card with a ``think`` input (a Mixture-of-Transformers card: ``bagel-mot``).
        scorer: a ``digit-scorer`` card.
        samples: partial prompts (each rendered with and without thinking).
        seed: the seed of the prompts (or picks) and of the generation seeds (``seed * 100_003 + i`` for item ``i``).
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: items generated per call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``{"samples", "num_steps", "guidance", "think": {"digit", "attributes", "prompt_right", "thought_complete",
        "follows_thought", "examples"}, "no_think": {"digit", "attributes", "prompt_right"}}``, rates in ``[0, 1]``.

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    if samples <= 0:
        raise ValueError(f"samples must be > 0 (got {samples})")
    rng = np.random.default_rng(seed)
    attrs = digits.ATTRIBUTES
    keys = ("digit",) + attrs
    labels = {
        "digit": rng.integers(0, 10, samples),
        **{name: rng.integers(0, len(words), samples) for name, words in digits.ATTRIBUTE_WORDS.items()},
    }
    named = rng.integers(0, len(attrs), samples)  # how many attributes the prefix names (0..2)
    prompts = [
        digits.caption(int(labels["digit"][i]), *(int(labels[a][i]) for a in attrs[: named[i]])) for i in range(samples)
    ]
    seeds = [seed * 100_003 + i for i in range(samples)]
    out = {
        "samples": samples,
        "num_steps": num_steps or _denoise_defaults(card).num_steps,
        "guidance": guidance or _denoise_defaults(card).guidance,
    }
    with progress_bar(total=2 * samples, desc=f"{card.model_id} think / no think", disable=not progress) as bar:
        for think in (True, False):
            thoughts: list[str] = []

            def render(s, think=think, thoughts=thoughts):
                res = generate(
                    card, prompts[s], seed=seeds[s], num_steps=num_steps, guidance=guidance, inputs={"think": think}
                )
                thoughts.extend(res["thought_text"])
                return res["image"]

            images = _in_batches(render, samples, batch, bar, should_stop)
            pred = {k: np.asarray(v) for k, v in digit_scorer.predict(scorer, images * 2.0 - 1.0).items()}
            asked = {k: (np.arange(samples) >= 0) if k == "digit" else named > attrs.index(k) for k in keys}
            right = {k: (pred[k] == labels[k]) | ~asked[k] for k in keys}
            mode = {
                "digit": float(np.mean(right["digit"])),
                "attributes": float(np.mean(np.all([right[a] for a in attrs], axis=0))),
                "prompt_right": float(np.mean(np.all([right[k] for k in keys], axis=0))),
            }
            if think:
                said = _parsed(thoughts)
                kept = np.all([(said[k] == labels[k]) | ~asked[k] for k in keys], axis=0)
                complete = np.all([said[k] >= 0 for k in keys], axis=0)
                follows = np.all([(said[k] < 0) | (pred[k] == said[k]) for k in keys], axis=0)
                mode.update(
                    thought_complete=float(np.mean(complete & kept)),
                    follows_thought=float(np.mean(follows & complete)),
                    examples=[f"{p} -> {t}" for p, t in zip(prompts[:5], thoughts[:5])],
                )
            out["think" if think else "no_think"] = mode
    return out


def _reasons(card: Card) -> bool:
    """Whether the card's program returns a reasoned caption (``reasoned_text``, e.g. ``cosmos3``)."""
    return any(name == "reasoned_text" for name, _ in registry.default_program(card).texts)


def t2v_quality(
    card: Card,
    scorer: Card,
    *,
    samples: int = 100,
    seed: int = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 50,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
    evaluator: Evaluator | None = None,
) -> dict:
    """Text-to-video (``wan-t2v``, ``ltx2-two-stage``, ``wan22-moe``, ``wan-causal``, ``cosmos3``), judged by
    motion, by ``scorer`` and, under ``"independent"``, by ``evaluator``'s digit classifier (``progress``,
    ``should_stop`` and ``evaluator`` as in ``t2i_quality``).

    ``full``: prompts naming digit and motion (``"seven moving right"``): the video moves as told
    (overall and per direction) and shows the digit (first and last frame). Cards that reason a
    caption first (``cosmos3``) are also judged on ``digit_only``: the prompt names the digit alone
    and the card reasons a motion: how often the reasoned caption names one, and how often the
    video moves as its own reasoning says.

    Args:
        card: a text-to-video card.
        scorer: a ``digit-scorer`` card.
        samples: random prompts per mode.
        seed: the seed of the prompts (or picks) and of the generation seeds (``seed * 100_003 + i`` for item ``i``).
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: items generated per call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.
        evaluator: the independent judge (default: ``evaluators.default_evaluator()``).

    Returns:
        ``{"samples", "num_steps", "guidance", "full": {...}}`` and, for a reasoning card, ``"digit_only"``. Each mode
        holds ``first_frame_digit_accuracy``, ``last_frame_digit_accuracy``, ``independent`` (the same two by
        ``evaluator``) and, for a reasoning card, ``examples``; ``full`` adds ``motion_accuracy`` and
        ``motion_accuracy_by_direction``, ``digit_only`` adds ``reasoned_a_motion`` and ``follows_its_reasoning``.

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    if samples <= 0:
        raise ValueError(f"samples must be > 0 (got {samples})")
    rng = np.random.default_rng(seed)
    digit = rng.integers(0, 10, samples)
    motion = rng.integers(0, len(digits.MOTION_NAMES), samples)
    seeds = [seed * 100_003 + i for i in range(samples)]
    defaults = _denoise_defaults(card)
    out = {"samples": samples, "num_steps": num_steps or defaults.num_steps, "guidance": guidance or defaults.guidance}
    modes = [("full", [digits.caption(int(d), motion=int(m)) for d, m in zip(digit, motion)])]
    reasons = _reasons(card)
    if reasons:
        modes.append(("digit_only", [digits.caption(int(d)) for d in digit]))
    judge = evaluator or default_evaluator()
    with progress_bar(total=len(modes) * samples, desc=f"{card.model_id} videos", disable=not progress) as bar:
        for mode, prompts in modes:
            texts: list[str] = []

            def render(s, prompts=prompts, texts=texts):
                res = generate(card, prompts[s], seed=seeds[s], num_steps=num_steps, guidance=guidance)
                if reasons:
                    texts.extend(res["reasoned_text"])
                return res["video"]

            videos = _in_batches(render, samples, batch, bar, should_stop)
            centroids = ink_centroids(videos)
            first = np.asarray(digit_scorer.predict(scorer, videos[:, 0] * 2.0 - 1.0)["digit"])
            last = np.asarray(digit_scorer.predict(scorer, videos[:, -1] * 2.0 - 1.0)["digit"])
            result = {
                "first_frame_digit_accuracy": float(np.mean(first == digit)),
                "last_frame_digit_accuracy": float(np.mean(last == digit)),
                "independent": {
                    f"{name}_frame_digit_accuracy": float(np.mean(judge.predict(videos[:, t]) == digit))
                    for name, t in (("first", 0), ("last", -1))
                },
            }
            if reasons:
                result["examples"] = texts[:5]
            if mode == "full":
                ok = moves_as_told(centroids[:, -1] - centroids[:, 0], motion)
                result["motion_accuracy"] = float(np.mean(ok))
                result["motion_accuracy_by_direction"] = {
                    name: float(np.mean(ok[motion == m]))
                    for m, name in enumerate(digits.MOTION_NAMES)
                    if np.any(motion == m)
                }
            else:
                said = np.array(
                    [digits.parse_caption(t)["motion"] if _parses(t) else None for t in texts], dtype=object
                )
                named = np.array([m is not None for m in said])
                told = np.where(named, [m if m is not None else 0 for m in said], 0).astype(int)
                follows = moves_as_told(centroids[:, -1] - centroids[:, 0], told) & named
                result.update(reasoned_a_motion=float(np.mean(named)), follows_its_reasoning=float(np.mean(follows)))
            out[mode] = result
    return out


def _parses(text: str) -> bool:
    try:
        digits.parse_caption(text)
    except ValueError:
        return False
    return True


def judge(t2i: Card, i2v: Card, *, samples: int = 200, **common) -> dict:
    """``jaxpipe evaluate``'s digits report: ``t2i_quality`` of ``samples`` prompts and ``i2v_quality`` of half as
    many videos, both by the ``digit-scorer`` and the independent judges.

    Args:
      t2i: a text-to-image card of the digits vocabulary.
      i2v: an image-to-video card.
      samples: prompts of the image measure (videos: half as many, at least 1).
      **common: ``seed``, ``num_steps``, ``guidance``, ``progress``, ``should_stop`` for both.

    Returns:
      ``{"t2i": ..., "i2v": ...}``.
    """
    from jaxpipe import cards

    scorer = cards.load("digit-scorer")
    return {
        "t2i": t2i_quality(t2i, scorer, samples=samples, **common),
        "i2v": i2v_quality(i2v, scorer, samples=max(samples // 2, 1), **common),
    }
