"""How often the judge is right on fresh renders of known ground truth, per category (the evaluator's own test).

    python -m jaxpipe.shapes.judge_accuracy [--per-category 300] [--size 32]

``measure`` draws prompts of each category, lays out a true scene for each (``grammar.scene_for``), renders
it and asks the judge. It is 100% on well-separated objects at 32 and 64 pixels (and about 99% at 16);
``gap < 0`` lets objects touch and overlap, and ``noise`` adds pixel noise: where it fails. ``through=card``
passes every render through the card's autoencoder (encoded, then decoded, as a generated image is drawn):
the judge on pictures of the kind a card makes, with the truth known.
"""

from __future__ import annotations

import argparse
import json

import jax.numpy as jnp
import numpy as np

from jaxpipe.shapes.grammar import CATEGORIES, GAP, sample, sample_video, scene_for
from jaxpipe.shapes.judging import correct, judge, judge_video
from jaxpipe.shapes.scenes import render, render_video

__all__ = ["measure", "main"]


def measure(
    per_category: int = 300,
    *,
    size: int = 32,
    split: str = "train",
    seed: int = 7,
    gap: float = GAP,
    noise: float = 0.0,
    frames: int = 8,
    through=None,
) -> dict[str, float]:
    """The judge's accuracy on ``per_category`` fresh true renders of each category (and of video prompts).

    Args:
        per_category: renders per category.
        size: the image side.
        split: the prompts' split.
        seed: the draw's seed (category ``c`` uses ``(seed, c)``).
        gap: the layouts' smallest gap between objects (negative: they may overlap).
        noise: the std of Gaussian noise added to the pixels (in ``[0, 1]``, then clipped).
        frames: the video prompts' length.
        through: a card whose ``vae`` each picture is encoded and decoded by (``None``: the renders as drawn).

    Returns:
        ``{category: accuracy, ..., "video": accuracy}``.
    """
    out = {}
    for c, category in enumerate((*CATEGORIES, "video")):
        rng = np.random.default_rng([seed, c])
        prompts, pictures = [], []
        for _ in range(per_category):
            if category == "video":
                prompt = sample_video(rng, split)
                picture = render_video(scene_for(prompt, rng, frames, gap=gap), frames, size)
            else:
                prompt = sample(category, rng, split)
                picture = render(scene_for(prompt, rng, gap=gap), size)
            picture = np.clip(picture + noise * rng.standard_normal(picture.shape), 0, 1) if noise else picture
            prompts.append(prompt)
            pictures.append(picture)
        pictures = np.stack(pictures) if through is None else _round_trip(through, np.stack(pictures))
        right = 0
        for picture, prompt in zip(pictures, prompts):
            checks = judge_video(picture, prompt) if category == "video" else judge(picture, prompt)
            right += correct(checks, category)
        out[category] = right / per_category
    return out


def _round_trip(card, pictures: np.ndarray, batch: int = 64) -> np.ndarray:
    """``pictures`` ``(N, [T,] H, W, 3)`` in ``[0, 1]`` encoded and decoded by ``card["vae"]``, in ``[0, 1]``."""
    vae = card["vae"]
    shape = pictures.shape
    flat = pictures.reshape(-1, *shape[-3:])
    out = [
        np.asarray(vae.decode(vae.encode(jnp.asarray(flat[i : i + batch]) * 2.0 - 1.0)))
        for i in range(0, len(flat), batch)
    ]
    return np.clip((np.concatenate(out) + 1.0) / 2.0, 0.0, 1.0).reshape(shape)


def main(argv: list[str] | None = None) -> None:
    """Print ``measure``'s accuracies as JSON, for the sizes, gaps and noise levels asked.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description="Measure the shapes judge on fresh renders.")
    parser.add_argument("--per-category", type=int, default=300)
    parser.add_argument("--size", type=int, nargs="+", default=[32])
    parser.add_argument("--gap", type=float, nargs="+", default=[GAP])
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0])
    parser.add_argument("--split", default="train")
    parser.add_argument("--card", help="pass every render through this card's autoencoder (an id or a folder)")
    args = parser.parse_args(argv)
    through = None
    if args.card:
        from jaxpipe import cards

        through = cards.load(args.card)
    for size in args.size:
        for gap in args.gap:
            for noise in args.noise:
                result = measure(args.per_category, size=size, split=args.split, gap=gap, noise=noise, through=through)
                print(
                    json.dumps(
                        {"size": size, "gap": gap, "noise": noise, "split": args.split, "card": args.card, **result}
                    )
                )


if __name__ == "__main__":
    main()
