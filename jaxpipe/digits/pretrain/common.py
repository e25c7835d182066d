"""What the digits pretraining recipes share: their command lines, their optimiser, batches of encoded data."""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.training.methods.finetune import FinetuneConfig
from jaxpipe.training.optim import Optimizer

__all__ = ["settings_parser", "parse_settings", "recipe_optimizer", "finetune_config", "encode_dataset", "array_batches"]


def recipe_optimizer(learning_rate: float, warmup_steps: int, total_steps: int, *, weight_decay: float = 0.0,
                     grad_clip: float = 1.0, end_fraction: float = 0.1) -> Optimizer:
    """A recipe's clipped AdamW: linear warm-up over ``warmup_steps``, cosine decay to ``end_fraction`` of
    ``learning_rate`` at ``total_steps``."""
    return Optimizer(learning_rate, grad_clip=grad_clip, weight_decay=weight_decay, schedule="warmup_cosine",
                     warmup_steps=warmup_steps, total_steps=total_steps, end_fraction=end_fraction)


def finetune_config(learning_rate: float, total_steps: int, *, warmup_steps: int = 100, **changes) -> FinetuneConfig:
    """``FinetuneConfig`` of a recipe: its schedule's peak rate, length and warm-up, plus config ``changes``."""
    optimizer = dataclasses.replace(FinetuneConfig().optimizer, learning_rate=learning_rate, total_steps=total_steps,
                                    warmup_steps=warmup_steps)
    return FinetuneConfig(optimizer=optimizer, **changes)


def encode_dataset(card: Card, data, chunk: int = 256) -> dict[str, np.ndarray]:
    """``{"latents": (N, T, h, w, C), "ids": (N, L)}``: a dataset encoded once by the card's (frozen) autoencoder."""
    encode = jax.jit(lambda vae, x: generator.TEXT_FLOW.latents({"vae": vae}, x))
    pixels = data.video if hasattr(data, "video") else data.image
    name = "video" if hasattr(data, "video") else "image"
    latents = np.concatenate([np.asarray(encode(card["vae"], {name: jnp.asarray(pixels[i : i + chunk])}))
                              for i in range(0, len(pixels), chunk)])
    ids = card.spec.tokenizer.encode(list(data.caption), card["text_encoder"].cfg.max_len)
    return {"latents": latents, "ids": ids}


def array_batches(arrays: dict[str, np.ndarray], batch_size: int, *, seed: int):
    """Endless shuffled fixed-size batches (as jax arrays) of equally long arrays; epoch ``e`` uses ``(seed, e)``."""
    n = len(next(iter(arrays.values())))
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in 1..{n} (got {batch_size})")
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(n)
        for i in range(0, n - batch_size + 1, batch_size):
            idx = order[i : i + batch_size]
            yield {k: jnp.asarray(v[idx]) for k, v in arrays.items()}
        epoch += 1


def settings_parser(settings_cls, description: str) -> argparse.ArgumentParser:
    """A pretraining command line: ``--out`` and one ``--flag`` per field of the frozen settings dataclass
    ``settings_cls`` (its defaults; booleans as ``--flag`` / ``--no-flag``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="directory to write the card to")
    defaults = settings_cls()
    for field in dataclasses.fields(settings_cls):
        default = getattr(defaults, field.name)
        kind = {"action": argparse.BooleanOptionalAction} if isinstance(default, bool) else {"type": type(default)}
        parser.add_argument(f"--{field.name.replace('_', '-')}", default=default, **kind)
    return parser


def parse_settings(parser: argparse.ArgumentParser, settings_cls, argv=None):
    """``(args, settings)``: the parsed command line and the ``settings_cls`` its flags describe."""
    args = parser.parse_args(argv)
    return args, settings_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(settings_cls)})
