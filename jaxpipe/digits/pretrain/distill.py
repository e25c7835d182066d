"""Reproducible few-step distillation of a bundled card (``DMD2``), writing a bundled card folder.

    python -m jaxpipe.digits.pretrain.distill flux-t2i-turbo --steps 500 --out jaxpipe/digits/assets/flux-t2i-turbo

A recipe names the teacher (a bundled card), the ``DMD2Config`` and the prompt distribution; the
run draws ``prompts`` prompts per step from ``prompt_batches`` (fixed seed), trains, and saves the
student with ``save_card(..., base=teacher, base_components=(everything but the denoiser))``: only
the distilled denoiser is stored. ``metrics.jsonl`` (one line per step) and ``pretrain.json`` (the
settings and timings) go next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np

from jaxpipe import cards
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.digits.prompts import PromptSpec, prompt_batches
from jaxpipe.training.distribution_matching import DistributionMatching
from jaxpipe.training.methods.dmd2 import DMD2, DMD2Config
from jaxpipe.training.optim import Optimizer

__all__ = ["Recipe", "RECIPES", "distill", "main"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A distilled card: its teacher (bundled id), the DMD2 settings, prompts per step and their spec, seed.

    Attributes:
        teacher: the bundled card distilled (it also provides every component but the denoiser).
        config: the ``DMD2`` settings.
        prompts: prompts per student step.
        spec: the prompt distribution (``prompt_batches``).
        seed: the seed of the initialisation (``seed``), the prompts and the steps' keys (``seed + 1``).
    """

    teacher: str
    config: DMD2Config
    prompts: int = 32
    spec: PromptSpec = PromptSpec(mention=0.5)
    seed: int = 0


RECIPES: dict[str, Recipe] = {
    "flux-t2i-turbo": Recipe(
        teacher="flux-t2i",
        config=DMD2Config(
            student_steps=2,
            student=Optimizer(1e-4, b1=0.0),
            dm=DistributionMatching(critic=Optimizer(2e-4, b1=0.0), critic_steps=5),
            model_id="flux-t2i-turbo",
        ),
    ),
}
"""Distilled card id -> its ``Recipe``."""


def distill(
    model_id: str, steps: int, out: str | Path | None = None, *, prompts: int | None = None, log_every: int = 10
):
    """Run recipe ``model_id`` for ``steps`` student steps: ``(student card, run log dict)``; with ``out``
    the card (denoiser only, the rest from its teacher), ``metrics.jsonl`` and ``pretrain.json`` are written there.

    Args:
        model_id: a key of ``RECIPES``.
        steps: student updates, at least 1.
        out: the directory to write the card folder to (``None``: write nothing).
        prompts: prompts per step (default: the recipe's).
        log_every: print a JSON metrics line every ``log_every`` steps and at the last (0: never).

    Returns:
        The student card and the run's log: ``model_id``, teacher, method, settings, ``final`` (metrics
        averaged over the last 10 steps), ``skipped_steps``, ``train_s``, jax version and backend.

    Raises:
        ValueError: if ``model_id`` has no recipe or ``steps`` < 1.
    """
    if model_id not in RECIPES:
        raise ValueError(f"no distillation recipe {model_id!r}; known: {sorted(RECIPES)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1 (got {steps})")
    recipe = RECIPES[model_id]
    p = recipe.prompts if prompts is None else prompts
    teacher = cards.load(recipe.teacher)
    method = DMD2(teacher, recipe.config)
    state = method.init(jax.random.key(recipe.seed))
    batches = prompt_batches(teacher, recipe.spec, p, recipe.seed)
    key = jax.random.key(recipe.seed + 1)
    lines, start = [], time.perf_counter()
    for i in range(steps):
        key, k = jax.random.split(key)
        state, metrics = method.step(state, next(batches), k)
        lines.append({"step": i, **{k2: float(v) for k2, v in metrics.items()}})
        if log_every and (i % log_every == 0 or i == steps - 1):
            print(json.dumps({**lines[-1], "elapsed_s": round(time.perf_counter() - start, 1)}), flush=True)
    seconds = time.perf_counter() - start
    card = method.card(state)
    last = lines[-min(10, len(lines)) :]
    log = {
        "model_id": model_id,
        "teacher": recipe.teacher,
        "method": "DMD2",
        "settings": {
            "steps": steps,
            "prompts_per_step": p,
            "seed": recipe.seed,
            "prompt_spec": config_to_dict(recipe.spec),
            "dmd2": config_to_dict(recipe.config),
        },
        "final": {k: float(np.mean([line[k] for line in last])) for k in lines[-1] if k != "step"},
        "skipped_steps": int(sum(line["skipped"] for line in lines)),
        "train_s": seconds,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }
    if out is not None:
        out = Path(out)
        keep = (method.denoiser,)
        save_card(
            card, out, base=recipe.teacher, base_components=tuple(n for n in sorted(card.components) if n not in keep)
        )
        (out / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        (out / "pretrain.json").write_text(json.dumps(log, indent=2) + "\n")
    return card, log


def main(argv=None) -> None:
    """The command line: ``MODEL_ID [--steps N] [--prompts P] [--out DIR]``; prints the run's final metrics.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description="Distil a bundled card into a few-step student (DMD2).")
    parser.add_argument("model_id", choices=sorted(RECIPES))
    parser.add_argument("--steps", type=int, default=500, help="student updates")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the recipe's)")
    parser.add_argument("--out", default=None, help="write the card folder here")
    args = parser.parse_args(argv)
    _, log = distill(args.model_id, args.steps, args.out, prompts=args.prompts)
    print(json.dumps({k: log[k] for k in ("final", "skipped_steps", "train_s")}))


if __name__ == "__main__":
    main()
