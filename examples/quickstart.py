"""Quickstart: load the bundled flux-t2i card and render a prompt with ``jp.generate``, save a PNG.

    python examples/quickstart.py "seven thick" -o out/quickstart.png [--random]

``jp.generate`` runs the card's program: tokenizer -> text encoder -> DiT denoise loop (one jitted
``lax.scan``) -> decoder. ``--random`` uses a freshly initialised card instead (structured noise).
"""

import argparse
import time

import jax

import jaxpipe as jp
from jaxpipe.io import save_png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default="seven thick")
    parser.add_argument("-o", "--out", default="out/quickstart.png")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--random", action="store_true", help="use random weights instead of the bundled card")
    args = parser.parse_args()

    card = jp.cards.build("flux-t2i", seed=0) if args.random else jp.cards.load("flux-t2i")
    print(f"{card}  ({card.num_params():,} parameters, JAX on {jax.default_backend()})")
    start = time.perf_counter()
    image = jp.generate(card, args.prompt, seed=args.seed, num_steps=args.steps)["image"][0]
    image.block_until_ready()
    print(f"generated {tuple(image.shape)} for {args.prompt!r} in {time.perf_counter() - start:.2f} s (incl. compile)")
    print(f"wrote {save_png(image, args.out)}")


if __name__ == "__main__":
    main()
