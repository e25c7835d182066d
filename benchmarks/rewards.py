"""Reward throughput: CLIPScore and PickScore at ViT-B/16 size, jaxpipe's jitted JAX rewards vs transformers eager.

The same random weights (a transformers ``CLIPModel`` at openai/clip-vit-base-patch16's sizes, saved and loaded by
``jaxpipe.nn.clip_model``) score the same images and prompts. Each contender is the whole reward, image
normalisation through the score:

* ``jax``: the reward ``jaxpipe.rewards`` loads from that folder, ``jax.jit`` of ``reward(artifacts, prompts)``
  (CLIP preprocessing in-graph, prompts tokenised on the host through ``jax.pure_callback``, both towers);
* ``torch``: transformers ``CLIPModel`` eager under ``torch.no_grad`` (``get_image_features`` /
  ``get_text_features`` on the same normalised pixels and token ids), the formula as the published code
  writes it.

Images are already 224² (no resize on either side), so the two also agree in value (the score gap is printed).
Rows are images per second, the median of ``--repeats`` timed calls after a warm-up; both contenders run side by
side in one process, on the same threads.

    python benchmarks/rewards.py --results benchmarks/RESULTS.md
    python benchmarks/rewards.py --quick          # tiny sizes, prints only (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import report

from jaxpipe import rewards

PROMPTS = (
    "a photo of a red circle",
    "two cats on a sofa",
    "a watercolour of a lighthouse at dusk",
    "an astronaut riding a horse",
)


def _vocab(size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary of single bytes (with ``</w>`` forms) and CLIP's specials, ``size`` entries."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    words = sorted(alphabet) + [c + "</w>" for c in sorted(alphabet)]
    vocab = {w: i for i, w in enumerate(words[: size - 2])}
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = size - 2, size - 1
    return vocab, []


def clip_folder(root: pathlib.Path, *, quick: bool) -> pathlib.Path:
    """A random-weight transformers ``CLIPModel`` folder with a CLIP tokenizer and image processor."""
    import torch
    import transformers

    torch.manual_seed(0)
    if quick:
        text = dict(
            vocab_size=600,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=77,
        )
        vision = dict(
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        )
        projection, size = 16, 32
    else:  # openai/clip-vit-base-patch16
        text = dict(
            vocab_size=49408,
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=8,
            max_position_embeddings=77,
        )
        vision = dict(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=224,
            patch_size=16,
        )
        projection, size = 512, 224
    text.update(bos_token_id=text["vocab_size"] - 2, eos_token_id=text["vocab_size"] - 1)
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection)
    model = transformers.CLIPModel(config).eval()
    folder = root / "clip"
    model.save_pretrained(folder, safe_serialization=True)
    vocab, merges = _vocab(text["vocab_size"])
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    tokenizer = transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    tokenizer.save_pretrained(folder)
    transformers.CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    ).save_pretrained(folder)
    return folder


def _timed(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up (and, for JAX, the compile)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def torch_scores(folder: pathlib.Path, images: np.ndarray, texts: list[str]) -> dict[str, object]:
    """``{kind: () -> (B,) scores}``: transformers CLIPModel eager, as the published CLIPScore / PickScore code scores."""
    import torch
    import transformers

    model = transformers.CLIPModel.from_pretrained(folder).eval()
    processor = transformers.CLIPProcessor.from_pretrained(folder)
    tokens = processor.tokenizer(texts, padding="max_length", truncation=True, max_length=77, return_tensors="pt")
    mean = torch.tensor(processor.image_processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_processor.image_std).view(1, 3, 1, 1)
    pixels = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))

    def cosine():
        with torch.no_grad():
            image = model.get_image_features(pixel_values=(pixels - mean) / std)
            text = model.get_text_features(**tokens)
            image = getattr(image, "pooler_output", image)
            text = getattr(text, "pooler_output", text)
            image = image / image.norm(dim=-1, keepdim=True)
            text = text / text.norm(dim=-1, keepdim=True)
            return (image * text).sum(-1)

    return {
        "clipscore": lambda: (2.5 * torch.clamp(cosine(), min=0)).numpy(),
        "pickscore": lambda: (model.logit_scale.exp() * cosine()).detach().numpy(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="images per call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny CLIP, 1 repeat, prints only (the smoke test)")
    parser.add_argument("--results", type=pathlib.Path, help="write the section into this RESULTS.md")
    args = parser.parse_args()
    import torch

    repeats = 1 if args.quick else args.repeats
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = clip_folder(pathlib.Path(tmp), quick=args.quick)
        size = 32 if args.quick else 224
        for batch in args.batch:
            images = np.random.default_rng(batch).random((batch, size, size, 3), dtype=np.float32)
            texts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
            prompts = rewards.text_prompts(texts)
            reference = torch_scores(folder, images, texts)
            for kind in ("clipscore", "pickscore"):
                reward = rewards.load(f"{kind}:{folder}")
                jitted = jax.jit(lambda artifacts, prompts, reward=reward: rewards.score(reward, artifacts, prompts)[0])
                t_jax, ours = _timed(
                    lambda f=jitted, x={"image": images}, p=prompts: f(x, p).block_until_ready(), repeats
                )
                t_torch, theirs = _timed(reference[kind], repeats)
                rows.append(
                    {
                        "reward": kind,
                        "batch": batch,
                        "jax": batch / t_jax,
                        "torch": batch / t_torch,
                        "gap": float(np.max(np.abs(np.asarray(ours) - theirs))),
                    }
                )
                print(
                    f"{kind} B={batch}: jax {batch / t_jax:.2f} img/s, torch {batch / t_torch:.2f} img/s, "
                    f"max score gap {rows[-1]['gap']:.1e}",
                    flush=True,
                )
    size_name = "tiny CLIP (--quick)" if args.quick else "ViT-B/16 (openai/clip-vit-base-patch16's sizes)"
    lines = [
        f"`python benchmarks/rewards.py{' --quick' if args.quick else ''}`: {size_name}, random weights, 224² images "
        f"in [0, 1], 77-token prompts; images / s, median of {repeats} calls after a warm-up. jax: the "
        "`rewards.load('<kind>:DIR')` reward under `jax.jit` (preprocessing, host tokenising via `pure_callback`, "
        "both towers); torch: transformers `CLIPModel` eager, `torch.no_grad`, "
        f"{torch.get_num_threads()} threads.",
        "",
        *[f"- {k}: {v}" for k, v in report.machine_info(torch=torch.__version__).items()],
        "",
        "| reward | images per call | jax (img/s) | torch eager (img/s) | jax / torch | max score gap |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['reward']} | {r['batch']} | {r['jax']:.2f} | {r['torch']:.2f} | {r['jax'] / r['torch']:.2f}× | {r['gap']:.1e} |"
            for r in rows
        ],
    ]
    body = "\n".join(["## rewards", "", *lines])
    print(body)
    if args.results and not args.quick:
        report.write_section(args.results, "rewards", body)


if __name__ == "__main__":
    main()
