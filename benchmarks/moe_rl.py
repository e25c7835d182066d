"""FlowGRPO on the bundled ``wan22-moe`` with an SDE window wholly above the boundary: only the high-noise expert trains.

The window is steps ``[0, 3)`` of 8 (σ = 1, 0.875, 0.75 >= 0.5), so ``FlowGRPO.trained_experts`` is
``("transformer_high",)``; the reward is the ``digit-scorer``'s probability of the prompted digit,
averaged over the video's frames. Reports the reward curve, the quality of the card before and
after (``quality.t2v_quality`` at the card's default sampling: the frame digit accuracies read by the
``digit-scorer``, the reward's own weights, and under ``"independent"`` by the ``digit-classifier``, which
shares no weights with it), that the low-noise expert is
bit-identical after training, and the versions a publish into an engine gives each expert.

    python benchmarks/moe_rl.py --steps 80
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxpipe as jp
from jaxpipe.digits import quality
from jaxpipe.digits.captions import MOTION_NAMES, caption
from jaxpipe.digits.prompts import TEXT_WIDTH
from jaxpipe.digits.rewards import scorer_reward
from jaxpipe.prompts import Prompts
from jaxpipe.training import weight_sync
from jaxpipe.training.grpo import FlowGRPOConfig
from jaxpipe.training.methods.flow_grpo import FlowGRPO
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling


def batches(card, prompts: int, seed: int):
    """Endless ``Prompts`` of ``prompts`` random "<digit> moving <motion>" prompts with their digit labels (metadata)."""
    rng = np.random.default_rng(seed)
    while True:
        digit, motion = rng.integers(0, 10, prompts), rng.integers(0, len(MOTION_NAMES), prompts)
        captions = [caption(int(d), motion=int(m)) for d, m in zip(digit, motion)]
        yield Prompts.from_texts(card, captions, {"digit": digit.astype(np.int32)}, width=TEXT_WIDTH)


def same(a, b) -> bool:
    return all(
        bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (each sampled group-size times)")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.04, help="KL weight to the reference expert")
    parser.add_argument("--samples", type=int, default=200, help="quality prompts before and after")
    parser.add_argument("--json", default="/tmp/moe_rl.json")
    args = parser.parse_args()
    card, scorer = jp.cards.load("wan22-moe"), jp.cards.load("digit-scorer")
    config = FlowGRPOConfig(
        group=Group(4),
        sampling=Sampling(num_steps=8, sampler="sde", sde_window=(0, 3)),
        beta=args.beta,
        optimizer=Optimizer(args.learning_rate),
    )
    method = FlowGRPO(card, scorer_reward(scorer, ("digit",)), config)
    print("trained experts:", method.trained_experts)
    before = quality.t2v_quality(card, scorer, samples=args.samples)["full"]
    state, rewards, start = method.init(), [], time.perf_counter()
    data = batches(card, args.prompts, seed=0)
    for i in range(args.steps):
        state, metrics = method.step(state, next(data), jax.random.fold_in(jax.random.key(0), i))
        rewards.append(float(metrics["reward_mean"]))
        print(f"step {i}: reward {rewards[-1]:.3f} skipped {float(metrics['skipped']):.0f}", flush=True)
    train_s = time.perf_counter() - start
    trained = method.card(state)
    after = quality.t2v_quality(trained, scorer, samples=args.samples)["full"]
    engine = jp.Engine()
    engine.register(card)
    versions_before = engine.versions(card.model_id)
    versions_after = weight_sync.publish(engine, trained)
    k = max(1, args.steps // 4)
    out = {
        "trained_experts": list(method.trained_experts),
        "low_expert_bit_identical": same(trained["transformer_low"], card["transformer_low"]),
        "high_expert_changed": not same(trained["transformer_high"], card["transformer_high"]),
        "reward_first_quarter": float(np.mean(rewards[:k])),
        "reward_last_quarter": float(np.mean(rewards[-k:])),
        "rewards": rewards,
        "train_s": train_s,
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "group_size": config.group.size,
        "learning_rate": args.learning_rate,
        "beta": args.beta,
        "versions_before": versions_before,
        "versions_after": versions_after,
        "quality_before": {k2: v for k2, v in before.items() if k2 != "motion_accuracy_by_direction"},
        "quality_after": {k2: v for k2, v in after.items() if k2 != "motion_accuracy_by_direction"},
    }
    print(json.dumps({k2: v for k2, v in out.items() if k2 != "rewards"}, indent=2))
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
