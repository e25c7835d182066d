"""bfloat16 compute policy benchmark: what ``precision.with_dtype(card, "bfloat16")`` costs in accuracy and
buys (or not) in time on this machine, for the bundled digits cards ``flux-t2i``, ``wan-i2v`` and ``unified``.

Per card, float32 (the card as bundled) against bfloat16 (networks in bf16 with float32 master weights;
sampler, log-probs and outputs float32), side by side in one process:

* **velocity error**: the denoiser's velocity ``v(x_σ, σ, text[, first frame])`` on real held-out digits
  (images or videos encoded by the float32 autoencoder, ``x_σ = (1-σ)·x0 + σ·ε``, σ from 1 to 1/8, their
  own captions through each card's own text encoder): ``max|Δv| / max|v|`` and ``mean|Δv| / mean|v|``;
* **final difference**: the same prompts and seeds rendered with the card's default sampling (steps,
  guidance, and for ``unified`` its refiner at temperature 1) in both dtypes: mean and max ``|Δ|`` of the
  pixels in [0, 1] (``unified``: also how many refined prompts differ);
* **quality** (C4, ``jaxpipe.digits.quality``): digit accuracy and all-attributes-right on 200 prompts
  (t2i cards), motion accuracy and last-frame digit accuracy on 100 videos (``wan-i2v``), each read by the
  ``digit-scorer`` ("scorer") and by the independent evaluators ("independent": ``digit-classifier`` + readers);
* **time**: median wall ms of one denoiser call at a serving batch (``B`` rows), float32 and bfloat16
  interleaved; and of the whole default sampling call; plus, for ``flux-t2i``, one ``FlowGRPO.step``
  (``P × K`` rollout + update, ``--rl``; the bf16 step recomputes log-probs step by step, see
  ``rollout.generator_stats``). Compile = first call.

    python benchmarks/bf16.py            # full run; refreshes the "bf16" section of RESULTS.md
    python benchmarks/bf16.py --quick    # smoke test: fewer prompts and repeats, prints only
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxpipe as jp
from jaxpipe import precision
from jaxpipe.card import Card
from jaxpipe.digits import data as digits
from jaxpipe.digits import quality
from jaxpipe.nn import DiTCond

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

SECTION = "bf16"
CARDS = ("flux-t2i", "wan-i2v", "unified")
SIGMAS = np.linspace(1.0, 0.125, 8, dtype=np.float32)


def _ms(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return (time.perf_counter() - start) * 1e3


def velocity_inputs(card: Card, rows: int, seed: int = 0) -> dict:
    """Real held-out digits as noisy latents at ``SIGMAS`` (cycled), their captions' ids, the first frame (i2v)."""
    images, labels = digits.load_images("heldout")
    pick = np.random.default_rng(seed).permutation(len(images))[:rows]
    video = card.spec.family == "toy_i2v"
    if video:
        data = digits.make_videos(images[pick], labels[pick], seed=seed, frames=card.spec.config.frames)
        x0 = jax.jit(lambda vae, v: vae.encode_video(v))(card["vae"], jnp.asarray(data.video))
    else:
        data = digits.augment(images[pick], labels[pick], seed=seed)
        x0 = jax.jit(lambda vae, im: vae.encode(im)[:, None])(card["vae"], jnp.asarray(data.image))
    sigma = jnp.asarray(np.resize(SIGMAS, rows))
    noise = jax.random.normal(jax.random.key(seed), x0.shape)
    x = (1.0 - sigma.reshape((-1,) + (1,) * (x0.ndim - 1))) * x0 + sigma.reshape((-1,) + (1,) * (x0.ndim - 1)) * noise
    ids = jnp.asarray(card.spec.tokenizer.encode(list(data.caption), card.spec.config.text.max_len))
    return {"x": x, "sigma": sigma, "ids": ids, "first_frame": x0[:, 0] if video else None}


@jax.jit
def card_velocity(card: Card, inputs: dict) -> jax.Array:
    """The card's denoiser velocity, its text through the card's own text encoder."""
    ids = inputs["ids"]
    cond = DiTCond(card["text_encoder"](ids), ids != 0, inputs["first_frame"])
    return card["transformer"].velocity(inputs["x"], inputs["sigma"], cond)


def render(card: Card, prompts: list[str], first: np.ndarray | None) -> dict:
    """The card's default sampling of ``prompts`` (seeds 0..n-1)."""
    out = jp.generate(card, prompts, seed=list(range(len(prompts))), image=first)
    return out


def final_difference(cards: dict[str, Card], n: int) -> dict:
    images, labels = digits.load_images("heldout")
    pick = np.random.default_rng(1).permutation(len(images))[:n]
    is_video = cards["float32"].spec.family == "toy_i2v"
    if is_video:
        data = digits.make_videos(images[pick], labels[pick], seed=1, frames=cards["float32"].spec.config.frames)
        prompts, first = list(data.caption), (data.video[:, 0] + 1.0) / 2.0
    else:
        prompts, first = list(digits.augment(images[pick], labels[pick], seed=1).caption), None
    artifact = "video" if is_video else "image"
    outs = {name: render(card, prompts, first) for name, card in cards.items()}
    a, b = (np.asarray(outs[k][artifact]) for k in ("float32", "bfloat16"))
    diff = np.abs(a - b)
    result = {
        "pixels_mean_abs": float(diff.mean()),
        "pixels_max_abs": float(diff.max()),
        "rows_max_abs_over_0.1": float(np.mean(diff.reshape(n, -1).max(axis=1) > 0.1)),
    }
    texts = [outs[k].get("refined_text") for k in ("float32", "bfloat16")]
    if cards["float32"].spec.family == "unified" and texts[0] is not None:
        result["refined_prompts_differ"] = float(np.mean([x != y for x, y in zip(texts[0], texts[1])]))
    return result


def timings(cards: dict[str, Card], inputs: dict, n_render: int, repeats: int) -> dict:
    """Median wall ms of a denoiser call and of a default sampling call, f32 and bf16 interleaved."""
    first = None
    if cards["float32"].spec.family == "toy_i2v":
        first = np.full((n_render,) + cards["float32"].spec.config.image_shape, 0.5, np.float32)
    prompts = [digits.caption(i % 10) for i in range(n_render)]
    compile_ms = {}
    for name, card in cards.items():
        compile_ms[f"velocity {name}"] = _ms(lambda c=card: card_velocity(c, inputs))
        compile_ms[f"render {name}"] = _ms(lambda c=card: render(c, prompts, first))
    times = {(what, name): [] for what in ("velocity", "render") for name in cards}
    for r in range(repeats):
        for name in ("float32", "bfloat16") if r % 2 == 0 else ("bfloat16", "float32"):
            card = cards[name]
            times[("velocity", name)].append(_ms(lambda c=card: card_velocity(c, inputs)))
            times[("render", name)].append(_ms(lambda c=card: render(c, prompts, first)))
    return {"median": {k: statistics.median(v) for k, v in times.items()}, "compile_ms": compile_ms}


def rl_step_times(card: Card, scorer: Card, prompts: int, group: int, repeats: int) -> dict:
    """Median ms of one ``FlowGRPO.step`` (every repeat from the same state) in float32 and bfloat16."""
    from jaxpipe.digits.prompts import TEXT_WIDTH
    from jaxpipe.digits.rewards import REWARD_TERMS, scorer_reward
    from jaxpipe.prompts import Prompts
    from jaxpipe.training.grpo import FlowGRPOConfig
    from jaxpipe.training.methods.flow_grpo import FlowGRPO
    from jaxpipe.training.rollout import Group, Sampling

    rng = np.random.default_rng(0)
    labels = {"digit": rng.integers(0, 10, prompts)}
    captions = [digits.caption(int(d)) for d in labels["digit"]]
    metadata = {t: np.asarray(labels.get(t, np.full(prompts, -1)), np.int32) for t in REWARD_TERMS}
    batch = Prompts.from_texts(card, captions, metadata, width=TEXT_WIDTH)
    methods, states, out = {}, {}, {"compile_ms": {}}
    for dtype in ("float32", "bfloat16"):
        config = FlowGRPOConfig(
            group=Group(group), sampling=Sampling(num_steps=8, sampler="sde", sde_window=(0, 4)), dtype=dtype
        )
        methods[dtype] = FlowGRPO(card, scorer_reward(scorer, REWARD_TERMS), config)
        states[dtype] = methods[dtype].init()
        out["compile_ms"][dtype] = _ms(lambda d=dtype: methods[d].step(states[d], batch, jax.random.key(0)))
    times = {d: [] for d in methods}
    for r in range(repeats):
        for d in ("float32", "bfloat16") if r % 2 == 0 else ("bfloat16", "float32"):
            times[d].append(_ms(lambda d=d, r=r: methods[d].step(states[d], batch, jax.random.key(r))))
    out["median"] = {d: statistics.median(v) for d, v in times.items()}
    _, m = methods["bfloat16"].step(states["bfloat16"], batch, jax.random.key(0))
    out["bf16_ratio_mean"], out["bf16_approx_kl"] = float(m["ratio_mean"]), float(m["approx_kl"])
    return out


def card_quality(card: Card, scorer: Card, samples: int) -> dict:
    if card.spec.family == "toy_i2v":
        q = quality.i2v_quality(card, scorer, samples=max(samples // 2, 1))
        return {
            "motion accuracy": q["motion_accuracy"],
            "last-frame digit accuracy (scorer)": q["last_frame_digit_accuracy"],
            "last-frame digit accuracy (independent)": q["independent"]["last_frame_digit_accuracy"],
            "samples": q["samples"],
        }
    q = quality.t2i_quality(card, scorer, samples=samples)
    return {
        "digit accuracy (scorer)": q["digit_accuracy"],
        "digit accuracy (independent)": q["independent"]["digit_accuracy"],
        "all attributes right (scorer)": q["all_attributes_correct"],
        "all attributes right (independent)": q["independent"]["all_attributes_correct"],
        "samples": q["samples"],
    }


def run_card(model_id: str, scorer: Card, args) -> dict:
    f32 = jp.cards.load(model_id)
    cards = {"float32": f32, "bfloat16": precision.with_dtype(f32, "bfloat16")}
    inputs = velocity_inputs(f32, args.rows)
    v32, v16 = (np.asarray(card_velocity(cards[k], inputs)) for k in ("float32", "bfloat16"))
    d = np.abs(v16 - v32)
    result = {
        "dit": f32.spec.config.dit,
        "velocity": {
            "max_rel": float(d.max() / np.abs(v32).max()),
            "mean_rel": float(d.mean() / np.abs(v32).mean()),
            "dtype": str(v16.dtype),
        },
        "final": final_difference(cards, args.final),
        "time": timings(cards, inputs, args.render, args.repeats),
    }
    if args.samples:
        result["quality"] = {name: card_quality(card, scorer, args.samples) for name, card in cards.items()}
    print(
        f"{model_id}: velocity max rel {result['velocity']['max_rel']:.4f}, mean rel {result['velocity']['mean_rel']:.4f}; "
        f"final {result['final']}; time {result['time']['median']}; quality {result.get('quality')}",
        flush=True,
    )
    return result


def table(results: dict, rl: dict | None, args) -> str:
    lines = [
        (
            "| card | velocity max / mean rel. error | final pixels mean / max abs diff | quality float32 → bfloat16 "
            "| denoiser call ms f32 / bf16 (**bf16 / f32**) | default sampling ms f32 / bf16 (**bf16 / f32**) |"
        ),
        "|---|---:|---:|---|---:|---:|",
    ]
    for model_id, r in results.items():
        med = r["time"]["median"]
        q = r.get("quality")
        qual = "–"
        if q is not None:
            pairs = [f"{k} {q['float32'][k]:.3f} → {q['bfloat16'][k]:.3f}" for k in q["float32"] if k != "samples"]
            qual = "; ".join(pairs) + f" ({q['float32']['samples']})"
        final = r["final"]
        extra = (
            f"; refined prompts differ {final['refined_prompts_differ']:.0%}"
            if "refined_prompts_differ" in final
            else ""
        )
        lines.append(
            f"| {model_id} | {r['velocity']['max_rel']:.4f} / {r['velocity']['mean_rel']:.4f} "
            f"| {final['pixels_mean_abs']:.4f} / {final['pixels_max_abs']:.3f}{extra} | {qual} "
            f"| {med[('velocity', 'float32')]:.2f} / {med[('velocity', 'bfloat16')]:.2f} "
            f"(**{med[('velocity', 'bfloat16')] / med[('velocity', 'float32')]:.2f}×**) "
            f"| {med[('render', 'float32')]:.1f} / {med[('render', 'bfloat16')]:.1f} "
            f"(**{med[('render', 'bfloat16')] / med[('render', 'float32')]:.2f}×**) |"
        )
    if rl is not None:
        m = rl["median"]
        lines += [
            "",
            (
                f"FlowGRPO step on flux-t2i ({args.rl_prompts} prompts × {args.rl_group} samples, 8 steps, SDE window (0, 4), "
                f"scorer reward, rollout + update in one jit): float32 {m['float32']:.0f} ms, bfloat16 {m['bfloat16']:.0f} ms "
                f"(**{m['bfloat16'] / m['float32']:.2f}×**); compile {rl['compile_ms']['float32'] / 1e3:.1f} s / "
                f"{rl['compile_ms']['bfloat16'] / 1e3:.1f} s. The bf16 update at the rollout weights: ratio_mean "
                f"{rl['bf16_ratio_mean']:.7f}, approx_kl {rl['bf16_approx_kl']:.1e} (C2)."
            ),
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cards", default=",".join(CARDS))
    parser.add_argument("--rows", type=int, default=32, help="velocity-error rows (and the timed denoiser batch)")
    parser.add_argument(
        "--final", type=int, default=64, help="prompts rendered in both dtypes for the final difference"
    )
    parser.add_argument("--render", type=int, default=16, help="prompts per timed default sampling call")
    parser.add_argument("--samples", type=int, default=200, help="quality prompts per card (0: skip quality)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rl", action=argparse.BooleanOptionalAction, default=True, help="time a FlowGRPO step too")
    parser.add_argument("--rl-prompts", type=int, default=4)
    parser.add_argument("--rl-group", type=int, default=4)
    parser.add_argument("--rl-repeats", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.final, args.render, args.samples, args.repeats, args.rl_repeats = 8, 8, 4, 0, 2, 1
        args.rl_prompts, args.rl_group = 1, 2
    load = os.getloadavg()[0]
    start = time.perf_counter()
    scorer = jp.cards.load("digit-scorer")
    results = {model_id: run_card(model_id, scorer, args) for model_id in args.cards.split(",")}
    rl = (
        rl_step_times(jp.cards.load("flux-t2i"), scorer, args.rl_prompts, args.rl_group, args.rl_repeats)
        if args.rl
        else None
    )
    body = table(results, rl, args)
    print(body)
    if args.quick:
        return
    info = machine_info(
        **{
            "load average (1 min) before / after": f"{load:.2f} / {os.getloadavg()[0]:.2f}",
            "whole run": f"{time.perf_counter() - start:.0f} s",
        }
    )
    header = [
        "## bf16",
        "",
        (
            "**bf16 compute policy.** `python benchmarks/bf16.py`: each bundled card as shipped (float32) against "
            '`jaxpipe.precision.with_dtype(card, "bfloat16")` (networks in bfloat16 with float32 master weights; '
            "norm statistics, softmax, sampler, log-probs and outputs in float32), side by side in one process. "
            f"Velocity error: the denoiser on {args.rows} real held-out digits (float32-encoded latents noised at σ = 1 … 1/8, "
            "their own captions through each card's own text encoder): max |Δv| / max |v| and mean |Δv| / mean |v|. "
            f"Final difference: {args.final} prompts and seeds rendered with the card's default sampling in both dtypes "
            "(pixels in [0, 1]). Quality: `jaxpipe.digits.quality` (t2i: digit accuracy on plain prompts and all attributes "
            f"right on full prompts, {args.samples} prompts; wan-i2v: motion and last-frame digit accuracy, "
            f"{max(args.samples // 2, 1)} videos), each read by the digit-scorer (scorer) and by the independent evaluators "
            "(digit-classifier + analytic readers, no weights shared with the scorer; independent). Time: medians of {args.repeats} interleaved repeats of one denoiser "
            f"call on the {args.rows} rows and of one default sampling call of {args.render} prompts."
        ),
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        "",
    ]
    write_section(RESULTS, SECTION, "\n".join(header) + "\n" + body + "\n")


if __name__ == "__main__":
    main()
