"""The digits world: real handwritten digits, their captions and attributes, and every card bundled with jaxpipe.

A world is a plug-in package (``jaxpipe.worlds``): the core never imports it. This one holds

- the data: scikit-learn's ``load_digits`` upsampled to 16×16, rendered with attributes (stroke,
  position, brightness) and as 8-frame moving videos (``data``; vocabulary ``words``, ``captions``);
- the cards (``cards``): which core toy family builds ``flux-t2i``, ``wan-i2v``, ``unified``, ...
  at which sizes, and their pretrained weights (``assets/``); its reward model, the
  ``digit-scorer`` (``digit_scorer``);
- what RL on it needs: prompt streams (``prompts``), the scorer's reward (``rewards``), quality
  measures (``quality``, ``evaluation``), the run builders ``jaxpipe train`` calls (``runs``);
- judges that share no weights with the reward (``evaluators``): the ``digit-classifier`` card
  (``digit_classifier``) and analytic readers of stroke, position and brightness (``readers``), so a
  gain the scorer reports and they do not shows up as reward hacking;
- the recipes that pretrain every bundled card: ``python -m jaxpipe.digits.pretrain <card id> --out DIR``.

``register()`` puts its cards and workflows into the core's registries; ``jaxpipe.worlds`` calls it
the first time a registry is asked for a card it does not know (``jp.cards.load("flux-t2i")``).
"""

from jaxpipe.digits import data
from jaxpipe.digits.captions import ATTRIBUTE_WORDS, ATTRIBUTES, MOTION_NAMES, caption, parse_caption, split_prompt
from jaxpipe.digits.data import ImageDataset, VideoDataset, augment, batches, concat, load_images, make_videos
from jaxpipe.digits.words import BRIGHTNESS, DIGIT_WORDS, MOTIONS, POSITIONS, STROKES, VOCABULARY

__all__ = [
    "ATTRIBUTES",
    "ATTRIBUTE_WORDS",
    "BRIGHTNESS",
    "DIGIT_WORDS",
    "MOTIONS",
    "MOTION_NAMES",
    "POSITIONS",
    "STROKES",
    "VOCABULARY",
    "ImageDataset",
    "VideoDataset",
    "augment",
    "batches",
    "caption",
    "concat",
    "data",
    "load_images",
    "make_videos",
    "parse_caption",
    "register",
    "split_prompt",
]


def register() -> None:
    """Register the digits world's card families, card ids, bundled checkpoints, workflows, reward model and
    training recipes (``recipes``: what ``jaxpipe train`` runs)."""
    from jaxpipe.digits import cards, recipes, workflows
    from jaxpipe.rewards import named

    cards.register()
    workflows.register()
    recipes.register()
    from jaxpipe import evaluations
    from jaxpipe.digits import quality

    evaluations.register_evaluation(
        evaluations.Evaluation(
            "digits",
            image=("flux-t2i", "t2i"),
            video=("wan-i2v", "i2v"),
            judge=quality.judge,
            samples=200,
            description="digit and attribute accuracy by the digit-scorer and independent judges; I2V motion",
        )
    )
    named.register("digit-scorer", "digit-scorer", _scoring)


def _scoring(scorer):
    """The ``digit-scorer`` reward model: every reward term, labelled from the prompt's words."""
    from jaxpipe.digits.evaluators import labels_from_prompts
    from jaxpipe.digits.rewards import REWARD_TERMS, scorer_reward
    from jaxpipe.rewards.named import Scoring

    return Scoring(scorer_reward(scorer, REWARD_TERMS), labels_from_prompts, REWARD_TERMS)
