"""Measured quality (C4) of the digits world's image cards, judged by the ``digit-scorer`` card (the reward) and
by the independent evaluators (``evaluators``: ``digit-classifier`` and the readers).

``t2i_quality``: the fraction of images the scorer classifies as the prompted digit (for plain digit prompts
and for full compositional prompts), the accuracy of each prompted attribute, and the fraction with every
prompted attribute right. ``understanding_quality``: image -> caption accuracy. ``thinking_quality``: a card
that thinks before it draws, with and without thinking.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer
from jaxpipe.digits.evaluators import Evaluator, default_evaluator
from jaxpipe.digits.sampling import check_samples, header, in_batches, item_seeds, parsed, rendering
from jaxpipe.generate import generate
from jaxpipe.progress import progress_bar
from jaxpipe.stopping import Stopped

__all__ = ["t2i_quality", "understanding_quality", "thinking_quality"]


def t2i_quality(
    t2i: Card,
    scorer: Card,
    *,
    samples: int = 200,
    evaluator: Evaluator | None = None,
    **render,
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
        evaluator: the independent judge (default: ``evaluators.default_evaluator()``).
        **render: how the items are rendered (``sampling.Rendering``: ``seed``, ``num_steps``, ``guidance``,
            ``batch`` (default 100), ``progress``, ``should_stop``).

    Returns:
        ``{"samples", "num_steps", "guidance", "digit_accuracy", "digit_accuracy_compositional",
        "attribute_accuracy": {attribute: float}, "all_attributes_correct", "independent": {the same four}}``,
        accuracies in ``[0, 1]`` (``digit_accuracy``: on the plain-digit prompts; the rest: on the full ones).

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    seed, num_steps, guidance, batch, progress, should_stop = rendering(render, batch=100)
    check_samples(samples)
    rng = np.random.default_rng(seed)
    labels = {
        "digit": rng.integers(0, 10, samples),
        **{name: rng.integers(0, len(words), samples) for name, words in digits.ATTRIBUTE_WORDS.items()},
    }
    attrs = digits.ATTRIBUTES
    full = [digits.caption(*(int(labels[k][i]) for k in ("digit",) + attrs)) for i in range(samples)]
    plain = [digits.caption(int(d)) for d in labels["digit"]]

    def render(prompts, bar):
        return in_batches(
            lambda s: generate(
                t2i,
                prompts[s],
                seed=item_seeds(seed, s.start, s.stop),
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
        **header(t2i, samples, num_steps, guidance),
        **summaries["scorer"],
        "independent": summaries["independent"],
    }


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
    check_samples(samples)
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
    said = parsed(texts)
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
    **render,
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
        **render: how the items are rendered (``sampling.Rendering``: ``seed``, ``num_steps``, ``guidance``,
            ``batch`` (default 100), ``progress``, ``should_stop``).

    Returns:
        ``{"samples", "num_steps", "guidance", "think": {"digit", "attributes", "prompt_right", "thought_complete",
        "follows_thought", "examples"}, "no_think": {"digit", "attributes", "prompt_right"}}``, rates in ``[0, 1]``.

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    seed, num_steps, guidance, batch, progress, should_stop = rendering(render, batch=100)
    check_samples(samples)
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
    seeds = item_seeds(seed, 0, samples)
    out = header(card, samples, num_steps, guidance)
    with progress_bar(total=2 * samples, desc=f"{card.model_id} think / no think", disable=not progress) as bar:
        for think in (True, False):
            thoughts: list[str] = []

            def render(s, think=think, thoughts=thoughts):
                res = generate(
                    card, prompts[s], seed=seeds[s], num_steps=num_steps, guidance=guidance, inputs={"think": think}
                )
                thoughts.extend(res["thought_text"])
                return res["image"]

            images = in_batches(render, samples, batch, bar, should_stop)
            pred = {k: np.asarray(v) for k, v in digit_scorer.predict(scorer, images * 2.0 - 1.0).items()}
            asked = {k: (np.arange(samples) >= 0) if k == "digit" else named > attrs.index(k) for k in keys}
            right = {k: (pred[k] == labels[k]) | ~asked[k] for k in keys}
            mode = {
                "digit": float(np.mean(right["digit"])),
                "attributes": float(np.mean(np.all([right[a] for a in attrs], axis=0))),
                "prompt_right": float(np.mean(np.all([right[k] for k in keys], axis=0))),
            }
            if think:
                said = parsed(thoughts)
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
