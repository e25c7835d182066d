"""How often the judge is right on fresh renders of known ground truth, per category (the evaluator's own test).

    python -m jaxpipe.shapes.judge_accuracy [--per-category 300] [--size 32]

``measure`` draws prompts of each category, lays out a true scene for each (``grammar.scene_for``), renders
it and asks the judge. It is 100% on well-separated objects at 32 and 64 pixels (and about 99% at 16);
``gap < 0`` lets objects touch and overlap, and ``noise`` adds pixel noise: where it fails.
"""

from __future__ import annotations

import argparse
import json

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

    Returns:
        ``{category: accuracy, ..., "video": accuracy}``.
    """
    out = {}
    for c, category in enumerate((*CATEGORIES, "video")):
        rng = np.random.default_rng([seed, c])
        right = 0
        for _ in range(per_category):
            if category == "video":
                prompt = sample_video(rng, split)
                picture = render_video(scene_for(prompt, rng, frames, gap=gap), frames, size)
            else:
                prompt = sample(category, rng, split)
                picture = render(scene_for(prompt, rng, gap=gap), size)
            picture = np.clip(picture + noise * rng.standard_normal(picture.shape), 0, 1) if noise else picture
            checks = judge_video(picture, prompt) if category == "video" else judge(picture, prompt)
            right += correct(checks, category)
        out[category] = right / per_category
    return out


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
    args = parser.parse_args(argv)
    for size in args.size:
        for gap in args.gap:
            for noise in args.noise:
                result = measure(args.per_category, size=size, split=args.split, gap=gap, noise=noise)
                print(json.dumps({"size": size, "gap": gap, "noise": noise, "split": args.split, **result}))


if __name__ == "__main__":
    main()
