"""The headlines of the digits world's runs: what a report says changed between the before and after evaluations.

Each headline is ``(before, after) -> dict`` over two quality dicts (``jaxpipe.digits.evaluation``). A number
judged by the ``digit-scorer`` (the reward) is reported beside the same number judged by the independent
evaluators, and a scorer gain that beats the independent one by more than ``HACKING_GAP`` is flagged.
"""

from __future__ import annotations

__all__ = ["HACKING_GAP", "change", "judged", "generator", "refinement", "experts", "video"]

HACKING_GAP = 0.05
"""A scorer-judged gain that beats the independent evaluators' gain on the same images by more than this is
flagged in the report as reward hacking (the reward model sees a gain its judge does not)."""


def change(before: dict, after: dict, *path: str) -> dict:
    """The number at ``path`` before and after, and its change.

    Args:
      before: the quality dict before training.
      after: the quality dict after training.
      *path: the keys down to the number.

    Returns:
      ``{"before", "after", "change"}`` (no ``"change"`` when either number is ``None``).
    """
    b, a = before, after
    for key in path:
        b, a = b[key], a[key]
    if b is None or a is None:
        return {"before": b, "after": a}
    return {"before": b, "after": a, "change": a - b}


def judged(before: dict, after: dict, headline: dict[str, tuple[str, ...]]) -> dict:
    """For each ``name -> path`` to a scorer-judged number: its change and, as ``name (independent)``, the
    change of the same number judged by the independent evaluators (the path with ``"independent"`` before
    its last key); then ``reward_vs_independent``, a line saying whether the two agree.

    Args:
      before: the quality dict before training.
      after: the quality dict after training.
      headline: the reported names and the paths to their scorer-judged numbers.

    Returns:
      ``{name: change, f"{name} (independent)": change, ..., "reward_vs_independent": str}``.
    """
    out, gaps = {}, {}
    for name, path in headline.items():
        scorer = out[name] = change(before, after, *path)
        independent = out[f"{name} (independent)"] = change(before, after, *path[:-1], "independent", path[-1])
        gaps[name] = scorer["change"] - independent["change"]
    hacked = {name: gap for name, gap in gaps.items() if gap > HACKING_GAP}
    out["reward_vs_independent"] = (
        "REWARD HACKING: the scorer's gain exceeds the independent evaluators' by "
        + ", ".join(f"{gap:+.3f} ({name})" for name, gap in hacked.items())
        if hacked
        else f"reward and independent evaluators agree (every gap <= {HACKING_GAP})"
    )
    return out


def generator(before: dict, after: dict) -> dict:
    """The headline of a text-to-image run (``generator_quality``): all attributes, plain digits, run prompts.

    Args:
      before: the quality dict before training.
      after: the quality dict after training.

    Returns:
      The ``judged`` changes.
    """
    return judged(
        before,
        after,
        {
            "all_attributes_correct": ("all_attributes_correct",),
            "digit_accuracy_plain_prompts": ("digit_accuracy",),
            "run_prompts_all_right": ("run_prompts", "all_right"),
        },
    )


def refinement(before: dict, after: dict) -> dict:
    """The headline of a run whose card rewrites its prompt first (``refinement_quality``).

    Args:
      before: the quality dict before training.
      after: the quality dict after training.

    Returns:
      The ``judged`` changes of refined and original prompts, the refined-minus-original gaps and the
      preferred-word rates.
    """
    return {
        **judged(
            before,
            after,
            {
                "refined_all_right": ("refined", "all_right"),
                "original_all_right": ("original", "all_right"),
                "refined_prompted_right": ("refined", "prompted_right"),
            },
        ),
        "refined_minus_original_before": before["refined"]["all_right"] - before["original"]["all_right"],
        "refined_minus_original_after": after["refined"]["all_right"] - after["original"]["all_right"],
        "preferred_word_rate": change(before, after, "preferred_word_rate"),
        "preferred_word_rate_in_order": change(before, after, "preferred_word_rate_in_order"),
        "added_words": change(before, after, "added_words"),
    }


def experts(before: dict, after: dict) -> dict:
    """The headline of a multi-expert run: refined and original prompts, and each attribute's preferred-word rate.

    Args:
      before: the quality dict before training.
      after: the quality dict after training.

    Returns:
      The ``judged`` changes and ``preferred_{attribute}_rate`` changes.
    """
    rates = {
        f"preferred_{name}_rate": change(before, after, "preferred_word_rate_by_attribute", name)
        for name in before["preferred_word_rate_by_attribute"]
    }
    return {
        **judged(
            before,
            after,
            {"refined_all_right": ("refined", "all_right"), "original_all_right": ("original", "all_right")},
        ),
        **rates,
    }


def video(before: dict, after: dict) -> dict:
    """The headline of a video run (``video_quality``): motion, and the digit in the first and last frames.

    Args:
      before: the quality dict before training.
      after: the quality dict after training.

    Returns:
      ``motion_accuracy``'s change and the ``judged`` frame accuracies.
    """
    return {
        "motion_accuracy": change(before, after, "full", "motion_accuracy"),
        **judged(
            before,
            after,
            {
                "first_frame_digit_accuracy": ("full", "first_frame_digit_accuracy"),
                "last_frame_digit_accuracy": ("full", "last_frame_digit_accuracy"),
            },
        ),
    }
