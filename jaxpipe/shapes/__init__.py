"""The shapes world: procedurally rendered coloured shapes, GenEval's six prompt categories and an exact judge.

A world is a plug-in package (``jaxpipe.worlds``): the core never imports it. This one holds

- scenes (``scenes``): 1-4 circles, squares and triangles in six colours and two sizes on a dark canvas,
  rendered anti-aliased from their description at any resolution (32×32 by default), still or moving
  over 8+ frames; data is unlimited and deterministic in its seed;
- the prompt grammar (``grammar``): GenEval's categories (single object, two objects, counting, colours,
  position, colour attribution), a scene for every prompt, and a held-out split of colour-shape pairs
  no training caption shows (vocabulary: ``words``);
- the analytic judge: objects read from the pixels (colour components, shape by template,
  count, position), checked against the prompt (``judging``); measured exact on fresh renders (``judge_accuracy``);
- the cards (``cards``): ``shapes-t2i``, ``shapes-t2v`` and ``shapes-unified`` (a refiner LM, ``refiner``, in
  front of ``shapes-t2i``), and their recipes (``python -m jaxpipe.shapes.pretrain CARD --out DIR``);
- the judge as a reward (``rewards``) and the GenEval-style evaluation (``evaluation``);
- the RL runs ``jaxpipe train --world shapes`` trains (``runs``).

``register()`` puts its cards and its training recipes into the core's registries.
"""

from jaxpipe.shapes.grammar import CATEGORIES, HELDOUT_PAIRS, Prompt, Thing, parse, prompt_set, sample, scene_for
from jaxpipe.shapes.judging import correct, detect, judge, judge_video, score
from jaxpipe.shapes.scenes import Obj, Scene, render, render_video
from jaxpipe.shapes.words import COLOURS, SHAPES, SIZES, VOCABULARY

__all__ = [
    "CATEGORIES",
    "COLOURS",
    "HELDOUT_PAIRS",
    "SHAPES",
    "SIZES",
    "VOCABULARY",
    "Obj",
    "Prompt",
    "Scene",
    "Thing",
    "correct",
    "detect",
    "judge",
    "judge_video",
    "parse",
    "prompt_set",
    "register",
    "render",
    "render_video",
    "sample",
    "scene_for",
    "score",
]


def register() -> None:
    """Register the shapes world's cards (``shapes-t2i``, ``shapes-t2v``, ``shapes-unified``) and its training
    recipes (``runs``: ``jaxpipe train flow-grpo|nft --world shapes``)."""
    from jaxpipe import evaluations
    from jaxpipe.shapes import cards, evaluation, runs

    cards.register()
    runs.register()
    evaluations.register_evaluation(
        evaluations.Evaluation(
            "shapes",
            image=("shapes-t2i", "t2i"),
            video=("shapes-t2v", "t2v"),
            judge=evaluation.judge_cards,
            samples=24,
            description="GenEval's six categories on test prompts and held-out pairs; the video card's motion",
        )
    )
