"""FlowGRPO on the bundled flux-t2i card, rewarded by the digit-scorer (DESIGN §6, §10; issue 5 item 7).

    python examples/flow_grpo_digits.py --steps 300 --prompts-per-step 4 --group-size 4 --num-steps 8 \\
        --sde-window 0 4 --lr 1e-4 --beta 0.04 --terms digit stroke position brightness --out out/flow_grpo

Each step draws P random prompts (a random digit plus the attribute words of the trained
``--terms``), renders each K times with SDE sampling, scores them, and takes one clipped-PPO
step on the DiT (``jaxpipe.training.fit``: progress bar, ``DIR/metrics.jsonl``). Before and
after training it measures scorer-judged quality (``quality.t2i_quality`` at guidance 1 and the
RL step count) and sample diversity: the mean pairwise L2 distance between images of one prompt
across seeds. A diversity drop of more than 30% is reward hacking (mode collapse) and is
reported as a FAILURE, not a win. Writes ``DIR/report.json``, ``DIR/reward.png`` (if matplotlib is
installed) and the trained card to ``DIR/card``.

Measured (2 shared CPU cores, ~0.26 s/step, 200 eval prompts, guidance 1, 8 steps):
the command above raised the mean reward (sum of 4 scorer probabilities) from 3.80 (first 30
steps) to 3.93 (last 30); plain-prompt digit accuracy 0.70 -> 0.875, compositional
all-attributes-right 0.90 -> 0.97; diversity -18.7% (below the 30% collapse line).
``--lr 3e-4 --beta 0.004 --terms digit`` (150 steps) instead degraded the model: digit accuracy
0.70 -> 0.60 and all-attributes-right 0.90 -> 0.305 (digit-only prompts, no attribute reward).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxpipe as jp
from jaxpipe import quality
from jaxpipe.card import Card
from jaxpipe.cards import common, flux_t2i
from jaxpipe.checkpoint import save_card
from jaxpipe.data import digits
from jaxpipe.training.fit import fit
from jaxpipe.training.flow_grpo import REWARD_TERMS, FlowGRPO, FlowGRPOConfig, scorer_reward

DIVERSITY_COLLAPSE = 0.30
"""A relative drop in sample diversity larger than this counts as collapse (a failure)."""


def prompt_batches(card: Card, terms: tuple[str, ...], prompts_per_step: int, seed: int):
    """Endless batches ``{"ids", "labels"}``: random digit + the attribute words of ``terms``.

    Attributes not in ``terms`` are left out of the caption and labelled -1 (not prompted).
    """
    rng = np.random.default_rng(seed)
    while True:
        labels = {"digit": rng.integers(0, 10, prompts_per_step)}
        for name, words in digits.ATTRIBUTE_WORDS.items():
            labels[name] = rng.integers(0, len(words), prompts_per_step) if name in terms else np.full(prompts_per_step, -1)
        captions = [
            digits.caption(int(labels["digit"][i]), *(int(labels[a][i]) if labels[a][i] >= 0 else None for a in digits.ATTRIBUTES))
            for i in range(prompts_per_step)
        ]
        yield {
            "ids": common.tokenize(card, captions),
            "labels": {k: jnp.asarray(v, jnp.int32) for k, v in labels.items() if k == "digit" or k in terms},
        }


def diversity(card: Card, *, prompts: int = 10, seeds: int = 6, num_steps: int, seed: int = 0) -> float:
    """Mean pairwise L2 distance between the images of one prompt across ``seeds`` seeds, averaged over prompts."""
    rng = np.random.default_rng(seed + 7)
    captions = [
        digits.caption(int(rng.integers(10)), *(int(rng.integers(len(w))) for w in digits.ATTRIBUTE_WORDS.values()))
        for _ in range(prompts)
    ]
    batch = [c for c in captions for _ in range(seeds)]
    seed_list = [seed * 1_000 + 500_000 + s for _ in captions for s in range(seeds)]
    images = np.asarray(flux_t2i.generate(card, batch, seed=seed_list, num_steps=num_steps, guidance=1.0))
    images = images.reshape(prompts, seeds, -1).astype(np.float64)
    dist = np.linalg.norm(images[:, :, None] - images[:, None, :], axis=-1)  # (P, S, S)
    iu = np.triu_indices(seeds, k=1)
    return float(dist[:, iu[0], iu[1]].mean())


def evaluate(card: Card, scorer: Card, args) -> dict:
    start = time.perf_counter()
    q = quality.t2i_quality(card, scorer, samples=args.eval_samples, seed=args.seed + 1, num_steps=args.num_steps, guidance=1.0)
    q["diversity"] = diversity(card, num_steps=args.num_steps, seed=args.seed)
    q["eval_seconds"] = time.perf_counter() - start
    return q


def plot_rewards(history: list[dict], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped: matplotlib is not installed (rewards are in metrics.jsonl)"
    r = np.array([row["reward_mean"] for row in history])
    w = max(1, len(r) // 10)
    smooth = np.convolve(r, np.ones(w) / w, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(r, alpha=0.35, label="reward (per step)")
    ax.plot(np.arange(w - 1, len(r)), smooth, label=f"moving mean ({w})")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--prompts-per-step", "-P", type=int, default=4)
    parser.add_argument("--group-size", "-K", type=int, default=4)
    parser.add_argument("--num-steps", type=int, default=8, help="denoising steps of the rollout and the evaluation")
    parser.add_argument("--sde-window", type=int, nargs=2, default=(0, 4), metavar=("START", "STOP"),
                        help="denoise steps sampled with the SDE and trained (the rest are ODE)")
    parser.add_argument("--noise-level", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--clip-eps", type=float, default=1e-3)
    parser.add_argument("--terms", nargs="+", default=list(REWARD_TERMS), choices=REWARD_TERMS)
    parser.add_argument("--eval-samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="out/flow_grpo")
    args = parser.parse_args()
    if "digit" not in args.terms:
        parser.error("--terms must include digit (every prompt names a digit)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    terms = tuple(args.terms)

    card, scorer = jp.cards.load("flux-t2i"), jp.cards.load("digit-scorer")
    config = FlowGRPOConfig(
        group_size=args.group_size, num_steps=args.num_steps, noise_level=args.noise_level,
        sde_window=tuple(args.sde_window), clip_eps=args.clip_eps, beta=args.beta, learning_rate=args.lr,
    )
    method = FlowGRPO(card, scorer_reward(scorer, terms), config)
    print(f"FlowGRPO on {card.model_id}: terms={terms}  P={args.prompts_per_step} K={args.group_size} "
          f"num_steps={args.num_steps} sde_window={tuple(args.sde_window)} lr={args.lr} beta={args.beta}  "
          f"(JAX on {jax.default_backend()})")

    print(f"evaluating before ({args.eval_samples} prompts, guidance 1, {args.num_steps} steps) ...")
    before = evaluate(card, scorer, args)
    print(json.dumps({k: v for k, v in before.items() if k != "attribute_accuracy"}))

    metrics_path = out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    state = method.init()
    batches = prompt_batches(card, terms, args.prompts_per_step, args.seed)
    start = time.perf_counter()
    state, history = fit(method.step, state, batches, steps=args.steps, key=jax.random.key(args.seed),
                         metrics_path=metrics_path, desc="flow-grpo")
    jax.block_until_ready(state)
    train_seconds = time.perf_counter() - start
    trained = method.card(state)

    print("evaluating after ...")
    after = evaluate(trained, scorer, args)
    print(json.dumps({k: v for k, v in after.items() if k != "attribute_accuracy"}))

    rewards = np.array([row["reward_mean"] for row in history])
    n = max(1, min(10, len(rewards) // 4))
    change = (after["diversity"] - before["diversity"]) / max(before["diversity"], 1e-12)
    collapsed = change < -DIVERSITY_COLLAPSE
    report = {
        "args": vars(args),
        "train_seconds": train_seconds,
        "seconds_per_step": train_seconds / args.steps,
        "reward_first": float(rewards[:n].mean()),
        "reward_last": float(rewards[-n:].mean()),
        "reward_window": n,
        "skipped_updates": int(sum(row.get("skipped", 0.0) for row in history)),
        "before": before,
        "after": after,
        "diversity_change": change,
        "diversity_collapse": bool(collapsed),
        "reward_png": plot_rewards(history, out / "reward.png"),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    save_card(trained, out / "card")

    print(f"\nreward (mean of {n} steps): first {report['reward_first']:.3f} -> last {report['reward_last']:.3f}")
    for key in ("digit_accuracy", "digit_accuracy_compositional", "all_attributes_correct"):
        print(f"{key:30s} {before[key]:.3f} -> {after[key]:.3f} ({after[key] - before[key]:+.3f})")
    print(f"{'diversity (pairwise L2)':30s} {before['diversity']:.3f} -> {after['diversity']:.3f} ({100 * change:+.1f}%)")
    if collapsed:
        print(f"FAILURE: sample diversity collapsed by {-100 * change:.1f}% (> {100 * DIVERSITY_COLLAPSE:.0f}%): "
              "the reward gain is not trustworthy (reward hacking / mode collapse)")
    print(f"training: {train_seconds:.1f} s for {args.steps} steps ({train_seconds / args.steps:.2f} s/step incl. compile)")
    print(f"reward curve: {report['reward_png']}")
    print(f"wrote {out / 'report.json'}, {metrics_path}, {out / 'card'}")


if __name__ == "__main__":
    main()
