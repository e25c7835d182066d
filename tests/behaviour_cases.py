"""Fixed-seed runs of every trainer and of the bundled cards, whose exact numbers are committed test data.

Each case returns JSON-able rows: a trainer's per-step metrics (its first 8 steps; 3 for a
pretraining script) or a digest of a bundled card's outputs. ``tests/data/behaviour.json`` holds
the values recorded before the trainers were rebuilt on one shared shape; ``test_behaviour.py``
checks that every case still gives them bit for bit (floats are stored as ``float.hex``).

    python tests/behaviour_cases.py            # print what differs from the recorded values
    python tests/behaviour_cases.py --record   # (re)record them (only when a change is meant to move them)

Run under the suite's XLA flags (``conftest``: ``--xla_backend_optimization_level=0``), which this
script sets the same way before JAX starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import jax
import numpy as np
from jaxpipe.digits import cards as digit_cards

DATA = Path(__file__).resolve().parent / "data" / "behaviour.json"
RL_STEPS = 8
PRETRAIN_STEPS = 3


def _rows(history) -> list[dict]:
    return [{k: float(v) for k, v in row.items()} for row in history]


def _fit(method, batches, steps: int = RL_STEPS, seed: int = 0) -> list[dict]:
    from jaxpipe.training.fit import fit

    state = method.init(jax.random.key(seed))
    _, history = fit(method.step, state, batches, steps=steps, key=jax.random.key(seed), progress=False)
    return _rows(history)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------------------------- RL
def _scorer():
    import jaxpipe as jp

    return jp.cards.load("digit-scorer")


def _generator(ppo=None, **changes):
    """The generator settings every RL case shares: K = 2, 4 steps, SDE on steps 0-1, β 0.04 (recorded so)."""
    from jaxpipe.training import FlowGRPOConfig, Group, Sampling
    from jaxpipe.training.ppo import Schedule

    return FlowGRPOConfig(group=Group(2), sampling=Sampling(num_steps=4, sampler="sde", sde_window=(0, 2)), beta=0.04,
                          ppo=ppo or Schedule(), **changes)


def flow_grpo(ppo=None, **changes):
    def case():
        import jaxpipe as jp
        from jaxpipe.digits.prompts import PromptSpec, prompt_batches
        from jaxpipe.digits.rewards import scorer_reward
        from jaxpipe.training import FlowGRPO

        card = jp.cards.load("flux-t2i")
        spec = PromptSpec()
        method = FlowGRPO(card, scorer_reward(_scorer(), spec.terms), _generator(ppo, **changes))
        return _fit(method, prompt_batches(card, spec, 2, 0))

    return case


def flow_grpo_ppo():
    from jaxpipe.training.ppo import Schedule

    return flow_grpo(Schedule(minibatches=2, inner_epochs=2, timestep_fraction=0.5), kl="flowgrpo")()


def flow_grpo_moe():
    import jaxpipe as jp
    from jaxpipe.digits.prompts import motion_batches
    from jaxpipe.digits.rewards import scorer_reward
    from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Sampling

    card = jp.cards.load("wan22-moe")
    config = FlowGRPOConfig(group=Group(2), sampling=Sampling(num_steps=4, sampler="sde", sde_window=(0, 2)))
    return _fit(FlowGRPO(card, scorer_reward(_scorer(), ("digit",)), config), motion_batches(card, 2, 0))


def unified(**changes):
    def case():
        import jaxpipe as jp
        from jaxpipe.digits.prompts import PromptSpec, prompt_batches
        from jaxpipe.digits.rewards import scorer_reward
        from jaxpipe.training import UnifiedRL, UnifiedRLConfig

        card = jp.cards.load("unified")
        spec = PromptSpec(mention=0.5, prefer=(("stroke", 1),))
        config = UnifiedRLConfig(generator=_generator(), **changes)
        return _fit(UnifiedRL(card, scorer_reward(_scorer(), spec.terms), config), prompt_batches(card, spec, 2, 0))

    return case


def joint(ppo=None, **changes):
    def case():
        import jaxpipe as jp
        from jaxpipe.digits import cards as digit_cards
        from jaxpipe.digits.prompts import PromptSpec, prompt_batches
        from jaxpipe.digits.rewards import scorer_reward
        from jaxpipe.training import JointMultiExpertRL, JointRLConfig

        card = digit_cards.multi_expert(jp.cards.load("unified"), 3)
        spec = PromptSpec(mention=0.0, prefer=(("stroke", 1), ("position", 2), ("brightness", 0)))
        config = JointRLConfig(generator=_generator(ppo), **changes)
        method = JointMultiExpertRL(card, scorer_reward(_scorer(), spec.terms), config)
        return _fit(method, prompt_batches(card, spec, 2, 0))

    return case


def joint_shared_map_ppo():
    from jaxpipe.training.ppo import Schedule

    return joint(Schedule(minibatches=2), credit="shared", expert_map="map")()


def mot():
    import jaxpipe as jp
    from jaxpipe.digits.prompts import PromptSpec, prompt_batches
    from jaxpipe.digits.rewards import scorer_reward
    from jaxpipe.training import MoTRLConfig, SharedMoTRL

    card = jp.cards.load("bagel-mot")
    spec = PromptSpec(mention=0.5)
    config = MoTRLConfig(generator=_generator())
    return _fit(SharedMoTRL(card, scorer_reward(_scorer(), spec.terms), config), prompt_batches(card, spec, 2, 0))


def nft():
    import jaxpipe as jp
    from jaxpipe.digits.prompts import PromptSpec, prompt_batches
    from jaxpipe.digits.rewards import scorer_reward
    from jaxpipe.training import EMA, DiffusionNFT, DiffusionNFTConfig, Group, Sampling

    card = jp.cards.load("flux-t2i")
    spec = PromptSpec()
    config = DiffusionNFTConfig(group=Group(2, adv_clip=2.0), sampling=Sampling(num_steps=4), ema=EMA(ramp_steps=4))
    return _fit(DiffusionNFT(card, scorer_reward(_scorer(), spec.terms), config), prompt_batches(card, spec, 2, 0))


def dmd2():
    import jaxpipe as jp
    from jaxpipe.digits.prompts import PromptSpec, prompt_batches
    from jaxpipe.training import DMD2, DMD2Config, DistributionMatching, Group, Optimizer

    card = jp.cards.load("flux-t2i")
    config = DMD2Config(student_steps=2, group=Group(2),
                        dm=DistributionMatching(critic=Optimizer(2e-4, b1=0.0), critic_steps=2))
    return _fit(DMD2(card, config), prompt_batches(card, PromptSpec(mention=0.5), 2, 0))


def self_forcing():
    import jaxpipe as jp
    from jaxpipe.digits.prompts import motion_batches
    from jaxpipe.training import DistributionMatching, Optimizer, SelfForcing, SelfForcingConfig

    card, teacher = jp.cards.load("wan-causal"), jp.cards.load("wan-t2v")
    config = SelfForcingConfig(dm=DistributionMatching(critic=Optimizer(2e-4, b1=0.0), critic_steps=2), critic_warmup=2)
    return _fit(SelfForcing(card, teacher, config), motion_batches(card, 2, 0))


# ------------------------------------------------------------------------------------------ pretraining
def pretrain_generator(model_id: str):
    def case():
        from jaxpipe.digits.pretrain.generators import PretrainConfig, pretrain_generator

        cfg = PretrainConfig(autoencoder_steps=PRETRAIN_STEPS, steps=PRETRAIN_STEPS, batch_size=16, video_batch_size=4, copies=1)
        with tempfile.TemporaryDirectory() as out:
            pretrain_generator(model_id, out, cfg)
            rows = {"finetune": _read(Path(out) / "metrics.jsonl")}
            if (Path(out) / "autoencoder_metrics.jsonl").is_file():
                rows["autoencoder"] = _read(Path(out) / "autoencoder_metrics.jsonl")
        return rows

    return case


def pretrain_lm():
    from jaxpipe.digits.pretrain.lm import LMPretrainConfig, pretrain_lm

    with tempfile.TemporaryDirectory() as out:
        pretrain_lm(out, LMPretrainConfig(steps=PRETRAIN_STEPS, batch_size=16), progress=False)
        return _read(Path(out) / "metrics.jsonl")


def pretrain_mot(model_id: str):
    def case():
        from jaxpipe.digits.pretrain.mot import MoTPretrainConfig, pretrain_mot

        cfg = MoTPretrainConfig(steps=PRETRAIN_STEPS, batch_size=8, video_batch_size=2, copies=1)
        with tempfile.TemporaryDirectory() as out:
            pretrain_mot(out, cfg, model_id=model_id, progress=False)
            return _read(Path(out) / "metrics.jsonl")

    return case


def pretrain_moe():
    from jaxpipe.digits.pretrain.moe import MoEPretrainConfig, pretrain_moe

    with tempfile.TemporaryDirectory() as out:
        pretrain_moe(out, MoEPretrainConfig(steps=PRETRAIN_STEPS, batch_size=4, copies=1, eval_videos=4))
        return _read(Path(out) / "metrics.jsonl")


def pretrain_causal():
    from jaxpipe.digits.pretrain.causal import CausalPretrainConfig, pretrain_causal

    with tempfile.TemporaryDirectory() as out:
        pretrain_causal(out, CausalPretrainConfig(steps=PRETRAIN_STEPS, batch_size=4, copies=1))
        return _read(Path(out) / "metrics.jsonl")


def pretrain_ltx2():
    from jaxpipe.digits.pretrain.ltx2 import PretrainConfig, pretrain_ltx2

    cfg = PretrainConfig(steps=PRETRAIN_STEPS, upsampler_steps=PRETRAIN_STEPS, batch_size=4, base_batch_size=4, copies=1)
    with tempfile.TemporaryDirectory() as out:
        pretrain_ltx2(out, cfg)
        return {"dit": _read(Path(out) / "metrics.jsonl"), "upsampler": _read(Path(out) / "upsampler_metrics.jsonl")}


def pretrain_scorer():
    """The first steps of ``python -m jaxpipe.digits.pretrain.scorer`` (its init, data, batch order and keys)."""
    from jaxpipe.digits.pretrain import scorer
    from jaxpipe.training.fit import fit

    config = scorer.ScorerTrainConfig(steps=PRETRAIN_STEPS, batch_size=16, copies=1)
    trainer = scorer.ScorerTrainer(config)
    k_init, k_steps = jax.random.split(jax.random.key(0))
    batches = scorer._batches(scorer.training_data(seed=0, copies=config.copies), config.batch_size, 0)
    _, history = fit(trainer.step, trainer.init(k_init), batches, steps=PRETRAIN_STEPS, key=k_steps, progress=False)
    return _rows(history)


def distill_turbo():
    from jaxpipe.digits.pretrain.distill import distill

    _, log = distill("flux-t2i-turbo", PRETRAIN_STEPS, prompts=4, log_every=0)
    return log["final"]


# ------------------------------------------------------------------------------------------ bundled cards
def _digest(out) -> str:
    h = hashlib.sha256()
    for name in sorted(out):
        value = out[name]
        h.update(name.encode())
        if isinstance(value, str) or (isinstance(value, (list, tuple)) and value and isinstance(value[0], str)):
            h.update(json.dumps(value).encode())
        else:
            a = np.ascontiguousarray(np.asarray(value))
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def bundled_outputs():
    """Digests of the engine's serial outputs (and ``jp.generate``'s) for the bundled cards and workflows."""
    import jaxpipe as jp
    from jaxpipe.cards import toy_multi_expert
    from jaxpipe.digits import data as digits

    engine = jp.Engine.default()
    engine.register(digit_cards.multi_expert(engine.card("unified"), 3))
    image = (digits.load_images("heldout")[0][0] + 1.0) / 2.0
    requests = [
        jp.Request("flux-t2i", prompt="seven thick", seed=0),
        jp.Request("flux-t2i", prompt="one thin left", seed=1, guidance=1.0),
        jp.Request("wan-i2v", prompt="seven moving right", image=image, seed=2, num_steps=4),
        jp.Request("unified", prompt="three", seed=3, num_steps=4),
        jp.Request("multi-expert", prompt="seven", seed=4, num_steps=4),
        jp.Request("image_video.t2i_i2v", prompt="two bright moving up", seed=5, num_steps=4),
        jp.Request("bagel-mot", prompt="four", seed=6, num_steps=3),
        jp.Request("cosmos3", prompt="four moving left", seed=6, num_steps=2),
        jp.Request("wan-t2v", prompt="five moving left", seed=7, num_steps=2),
        jp.Request("ltx2-two-stage", prompt="five moving left", seed=8, num_steps=2, inputs={"refine_steps": 2}),
        jp.Request("wan22-moe", prompt="five moving left", seed=9, num_steps=2),
        jp.Request("wan-causal", prompt="five moving left", seed=10, num_steps=2),
        jp.Request("flux-t2i-turbo", prompt="eight thick", seed=12),
        jp.Request("video.t2v_continue", prompt="six moving down", seed=11, num_steps=2),
    ]
    outs = engine.run_many(requests, mode="serial")
    rows = {f"engine {r.model} {r.prompt!r} seed {r.seed}": _digest(o) for r, o in zip(requests, outs)}
    for model, prompt in (("flux-t2i", "seven thick"), ("unified", "three"), ("wan-t2v", "five moving left")):
        rows[f"generate {model} {prompt!r}"] = _digest(dict(jp.generate(engine.card(model), [prompt], seed=0, num_steps=2)))
    scorer = engine.card("digit-scorer")
    from jaxpipe.digits import digit_scorer

    probs = digit_scorer.score(scorer, jax.numpy.asarray(digits.load_images("heldout")[0][:8]))
    rows["digit-scorer heldout[:8]"] = _digest(probs)
    return rows


CASES = {
    "flow_grpo": flow_grpo(),
    "flow_grpo_ppo": flow_grpo_ppo,
    "flow_grpo_bf16": flow_grpo(dtype="bfloat16"),
    "flow_grpo_moe": flow_grpo_moe,
    "unified": unified(),
    "unified_prompt_only": unified(joint=False),
    "joint_per_expert_vmap": joint(credit="per_expert", expert_map="vmap"),
    "joint_shared_map_ppo": joint_shared_map_ppo,
    "mot": mot,
    "nft": nft,
    "dmd2": dmd2,
    "self_forcing": self_forcing,
    "pretrain_flux_t2i": pretrain_generator("flux-t2i"),
    "pretrain_wan_i2v": pretrain_generator("wan-i2v"),
    "pretrain_wan_t2v": pretrain_generator("wan-t2v"),
    "pretrain_lm": pretrain_lm,
    "pretrain_bagel_mot": pretrain_mot("bagel-mot"),
    "pretrain_cosmos3": pretrain_mot("cosmos3"),
    "pretrain_moe": pretrain_moe,
    "pretrain_causal": pretrain_causal,
    "pretrain_ltx2": pretrain_ltx2,
    "pretrain_scorer": pretrain_scorer,
    "distill_turbo": distill_turbo,
    "bundled_outputs": bundled_outputs,
}
"""Case name -> a function of no arguments returning its rows."""


def exact(value):
    """``value`` with every float as its ``float.hex`` (what the data file stores)."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {k: exact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [exact(v) for v in value]
    return value


def recorded_part(got, want):
    """``got`` cut down to what ``want`` records (metrics a method added since are not compared)."""
    if isinstance(want, dict) and isinstance(got, dict):
        return {k: recorded_part(got.get(k), v) for k, v in want.items()}
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        return [recorded_part(g, w) for g, w in zip(got, want)]
    return got


def recorded() -> dict:
    return json.loads(DATA.read_text()) if DATA.is_file() else {}


def main(argv: list[str]) -> int:
    record = "--record" in argv
    names = [a for a in argv if not a.startswith("--")] or list(CASES)
    data = recorded()
    bad = 0
    for name in names:
        rows = exact(CASES[name]())
        if record:
            data[name] = rows
            DATA.parent.mkdir(parents=True, exist_ok=True)
            DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            print(f"recorded {name}", flush=True)
        else:
            same = name in data and recorded_part(rows, data[name]) == data[name]
            bad += not same
            print(f"{name}: {'same' if same else 'DIFFERENT'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
