"""RL runs on the digits world, shared by ``jaxpipe train`` and the examples (DESIGN §5, §9, §10).

``prompts`` (which prompts a run draws, what the reward scores), ``evaluation`` (before/after
judging by the ``digit-scorer``: GenEval-style accuracy and diversity), ``builders`` (a ``Run``:
trainer, prompt stream, evaluation, curves) and ``reports`` (``execute``: train and write
metrics, curves, the report and the trained card).
"""

from jaxpipe.training.runs.builders import (
    Run, dmd2_run, flow_grpo_run, joint_run, mot_run, nft_run, self_forcing_run, unified_run,
)
from jaxpipe.training.runs.evaluation import (
    DIVERSITY_COLLAPSE,
    EvalSettings,
    diversity,
    generator_quality,
    judge,
    refinement_quality,
    serve,
    video_quality,
)
from jaxpipe.training.runs.prompts import (
    PromptSpec, Prompts, motion_batches, parse_preferences, parse_terms, prompt_batches, sample_prompts,
)
from jaxpipe.training.runs.reports import OUTPUTS, TIMING, execute, summary_lines

__all__ = [
    "DIVERSITY_COLLAPSE", "EvalSettings", "OUTPUTS", "TIMING", "PromptSpec", "Prompts", "Run", "diversity", "dmd2_run", "execute", "flow_grpo_run",
    "generator_quality", "joint_run",
    "mot_run", "nft_run", "judge", "parse_preferences", "parse_terms", "prompt_batches", "refinement_quality",
    "serve", "sample_prompts", "self_forcing_run", "summary_lines", "unified_run", "motion_batches", "video_quality",
]
