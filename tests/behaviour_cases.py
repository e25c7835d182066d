"""Fixed-seed runs of every trainer and of the bundled cards, whose exact numbers are committed test data.

Each case returns JSON-able rows: a trainer's per-step metrics (its first 8 steps; 3 for a
pretraining script) or a digest of a bundled card's outputs (its SHA-256 and each array's mean,
std, min and max). ``tests/data/behaviour.json`` holds them per *environment*: what decides
XLA's CPU arithmetic (the processor, its instruction set and caches, the core count, the jax /
jaxlib / numpy versions, ``XLA_FLAGS``). ``test_behaviour.py`` checks that every case gives its
recorded values bit for bit where they were recorded, and elsewhere within float noise of them
(another processor rounds matmuls and reductions differently: measured, 1.6e-5 of a metric's scale
at most in float32 after 8 RL steps, 6% in bfloat16).

    python tests/behaviour_cases.py            # print what differs from the recorded values
    python tests/behaviour_cases.py --record   # record them for this environment (a new machine, or a
                                               # change that is meant to move them: then re-record all)

Run under the suite's XLA flags (``tests/xla_flags.py``), which this script sets the same way before JAX starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import xla_flags

xla_flags.apply()

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

    return FlowGRPOConfig(
        group=Group(2),
        sampling=Sampling(num_steps=4, sampler="sde", sde_window=(0, 2)),
        beta=0.04,
        ppo=ppo or Schedule(),
        **changes,
    )


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
        from jaxpipe.training import JointMultiExpertRL, JointMultiExpertRLConfig

        card = digit_cards.multi_expert(jp.cards.load("unified"), 3)
        spec = PromptSpec(mention=0.0, prefer=(("stroke", 1), ("position", 2), ("brightness", 0)))
        config = JointMultiExpertRLConfig(generator=_generator(ppo), **changes)
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
    from jaxpipe.training import SharedMoTRL, SharedMoTRLConfig

    card = jp.cards.load("bagel-mot")
    spec = PromptSpec(mention=0.5)
    config = SharedMoTRLConfig(generator=_generator())
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
    from jaxpipe.training import DMD2, DistributionMatching, DMD2Config, Group, Optimizer

    card = jp.cards.load("flux-t2i")
    config = DMD2Config(
        student_steps=2, group=Group(2), dm=DistributionMatching(critic=Optimizer(2e-4, b1=0.0), critic_steps=2)
    )
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

        cfg = PretrainConfig(
            autoencoder_steps=PRETRAIN_STEPS, steps=PRETRAIN_STEPS, batch_size=16, video_batch_size=4, copies=1
        )
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

    cfg = PretrainConfig(
        steps=PRETRAIN_STEPS, upsampler_steps=PRETRAIN_STEPS, batch_size=4, base_batch_size=4, copies=1
    )
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
def _digest(out) -> dict:
    """An output dict's SHA-256 (names, dtypes, shapes, bytes, texts) and each numeric array's [mean, std, min, max]."""
    h = hashlib.sha256()
    stats = {}
    for name in sorted(out):
        value = out[name]
        h.update(name.encode())
        if isinstance(value, str) or (isinstance(value, (list, tuple)) and value and isinstance(value[0], str)):
            h.update(json.dumps(value).encode())
        else:
            a = np.ascontiguousarray(np.asarray(value))
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
            if a.size and (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
                x = a.astype(np.float64)
                stats[name] = [float(x.mean()), float(x.std()), float(x.min()), float(x.max())]
    return {"sha256": h.hexdigest(), "stats": stats}


def bundled_outputs():
    """Digests of the engine's serial outputs (and ``jp.generate``'s) for the bundled cards and workflows."""
    import jaxpipe as jp
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
        jp.Request("shapes-t2i", prompt="a red circle left of a blue triangle", seed=13, num_steps=4),
        jp.Request("shapes-t2v", prompt="a green square moving up", seed=14, num_steps=2),
        jp.Request("shapes-unified", prompt="a yellow square", seed=15, num_steps=2),
    ]
    outs = engine.run_many(requests, mode="serial")
    rows = {f"engine {r.model} {r.prompt!r} seed {r.seed}": _digest(o) for r, o in zip(requests, outs)}
    for model, prompt in (("flux-t2i", "seven thick"), ("unified", "three"), ("wan-t2v", "five moving left")):
        rows[f"generate {model} {prompt!r}"] = _digest(
            dict(jp.generate(engine.card(model), [prompt], seed=0, num_steps=2))
        )
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


# ------------------------------------------------------------------------------------------ recipes
def classifier_recipe(out: Path) -> dict:
    """Run the bundled ``digit-classifier``'s recipe into ``out`` as its card was made (XLA's default flags).

    Returns:
        ``{"sha256": of the weights file, "heldout_renders": its held-out accuracy}`` (~2 min on 2 cores).
    """
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the bundled run used XLA's default flags
    subprocess.run(
        [sys.executable, "-m", "jaxpipe.digits.pretrain", "digit-classifier", "--out", str(out), "--quiet"],
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    metrics = json.loads((Path(out) / "metrics.json").read_text())
    return {
        "sha256": hashlib.sha256((Path(out) / "weights.safetensors").read_bytes()).hexdigest(),
        "heldout_renders": metrics["accuracy"]["heldout_renders"],
    }


RECIPES = {"digit-classifier": classifier_recipe}
"""Bundled cards' full recipes (too slow for a case): ``--record NAME`` stores what this environment makes."""


# ------------------------------------------------------------------------------------------ environments
FLOAT_NOISE = {"flow_grpo_bf16": 0.25}
"""Per case, how far (a fraction of each metric's largest recorded magnitude) another environment may land
from the recorded values; float32 cases are allowed 1e-3 (measured: 1.6e-5 at most between two x86
processors), the bfloat16 run 25% (measured: 6%: bfloat16 keeps 8 bits and 8 RL steps compound them)."""
DEFAULT_NOISE = 1e-3
ABSOLUTE_NOISE = 1e-6  # metrics that are 0 up to rounding (the first update's KL, its clipped fraction)


def _cpu() -> tuple[str, str]:
    """The processor's model name and its feature flags, as Linux reports them (empty where it does not)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("model name", platform.processor()), fields.get("flags", fields.get("Features", ""))


def _caches() -> str:
    sizes = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            sizes.append("L{}{} {}".format(*((index / f).read_text().strip() for f in ("level", "type", "size"))))
        except OSError:
            pass
    return ", ".join(sizes)


def environment() -> dict:
    """What decides XLA's CPU arithmetic here (the same program rounds differently where any of it differs)."""
    import jaxlib

    model, flags = _cpu()
    return {
        "machine": platform.machine(),
        "cpu": model,
        "cpu_flags": hashlib.sha256(flags.encode()).hexdigest()[:12],
        "caches": _caches(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def environment_key(env: dict | None = None) -> str:
    """A short name for an :func:`environment` (the data file's key)."""
    return hashlib.sha256(json.dumps(env or environment(), sort_keys=True).encode()).hexdigest()[:16]


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


def _series(rows, path: str = "") -> dict[str, list]:
    """Recorded rows flattened to ``path -> values``: a list of per-step dicts gives one series per metric."""
    if isinstance(rows, dict):
        out: dict[str, list] = {}
        for key, value in rows.items():
            out.update(_series(value, f"{path}/{key}"))
        return out
    if isinstance(rows, list) and any(isinstance(r, (dict, list)) for r in rows):
        out = {}
        for row in rows:
            for key, values in _series(row, path).items():
                out.setdefault(key, []).extend(values)
        return out
    return {path: list(rows) if isinstance(rows, list) else [rows]}


def _float(value):
    return (
        float.fromhex(value)
        if isinstance(value, str) and value.startswith(("0x", "-0x", "inf", "-inf", "nan"))
        else value
    )


def differences(name: str, got, want) -> list[str]:
    """Where ``got`` is farther from ``want`` than another environment's rounding explains (both as stored).

    Floats are compared per metric, within ``FLOAT_NOISE[name]`` (else ``DEFAULT_NOISE``) of the metric's
    largest recorded magnitude plus ``ABSOLUTE_NOISE``; the cards' SHA-256 digests are not compared,
    their arrays' statistics are; everything else (texts, counts, shapes) must be equal.
    """
    noise = FLOAT_NOISE.get(name, DEFAULT_NOISE)
    mine, theirs = _series(recorded_part(got, want)), _series(want)
    bad = []
    for path, recorded_values in theirs.items():
        if path.endswith("/sha256"):
            continue
        values = mine.get(path)
        if values is None or len(values) != len(recorded_values):
            bad.append(f"{path}: {values!r} where {len(recorded_values)} values were recorded")
            continue
        w, g = [_float(v) for v in recorded_values], [_float(v) for v in values]
        if not all(isinstance(v, float) for v in w + g):
            if g != w:
                bad.append(f"{path}: {values!r} != {recorded_values!r}")
            continue
        w_arr, g_arr = np.asarray(w), np.asarray(g)
        allowed = noise * float(np.max(np.abs(w_arr))) + ABSOLUTE_NOISE
        worst = float(np.max(np.abs(g_arr - w_arr)))
        if not worst <= allowed:  # NaN where the recording has a number fails too
            bad.append(f"{path}: off by {worst:.3g} (allowed {allowed:.3g}): {g} vs {w}")
    return bad


def recorded() -> dict:
    """``environment key -> {"environment": ..., "cases": {case name -> rows}}`` from the data file."""
    return json.loads(DATA.read_text())["environments"] if DATA.is_file() else {}


def reference(data: dict, key: str | None = None) -> tuple[str, dict, bool]:
    """The recording to hold this environment to: ``(key, cases, exact)``; its own if it has one, else the first."""
    key = key or environment_key()
    if key in data:
        return key, data[key]["cases"], True
    first = sorted(data, key=lambda k: data[k]["recorded"])[0]
    return first, data[first]["cases"], False


def _record(data: dict, key: str, section: str, name: str, value) -> None:
    import datetime

    entry = data.setdefault(
        key, {"environment": environment(), "recorded": datetime.date.today().isoformat(), "cases": {}}
    )
    entry.setdefault(section, {})[name] = value
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(json.dumps({"environments": data}, indent=1, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    record = "--record" in argv
    names = [a for a in argv if not a.startswith("--")] or list(CASES)
    data = recorded()
    key = environment_key()
    print(f"environment {key}: {json.dumps(environment())}", flush=True)
    bad = 0
    for name in names:
        if name in RECIPES:
            with tempfile.TemporaryDirectory() as out:
                made = RECIPES[name](Path(out))
            if record:
                _record(data, key, "recipes", name, made["sha256"])
            print(f"{name}: {made}{' recorded' if record else ''}", flush=True)
            continue
        rows = exact(CASES[name]())
        if record:
            _record(data, key, "cases", name, rows)
            print(f"recorded {name}", flush=True)
            continue
        ref_key, cases, exactly = reference(data, key)
        if name not in cases:
            print(f"{name}: not recorded", flush=True)
            bad += 1
        elif exactly:
            same = recorded_part(rows, cases[name]) == cases[name]
            bad += not same
            print(f"{name}: {'same' if same else 'DIFFERENT'}", flush=True)
        else:
            off = differences(name, rows, cases[name])
            bad += bool(off)
            print(
                f"{name}: {'within float noise of ' + ref_key if not off else 'DIFFERENT'}",
                *off,
                sep="\n  ",
                flush=True,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
