"""The digits world's workflows: text -> image -> video across two cards, its nested extension, and video continuation.

Each splits a digits prompt into the image part and the motion part (``split_prompt``) where a
stage needs it; ``register()`` ships them with ``Engine.default()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jaxpipe.digits.captions import split_prompt
from jaxpipe.request import MAX_SEED, Request
from jaxpipe.workflow import Stage, Workflow, register_bundled

__all__ = ["t2i_i2v", "t2i_i2v_extended", "t2v_continue", "register"]


def _parts(prompt: str | None) -> tuple[str, str]:
    """The image prompt and the motion prompt (``"<digit> still"`` when the prompt has no motion)."""
    if prompt is None:
        raise ValueError("image_video workflows need a prompt, e.g. prompt='seven thick moving right'")
    image, motion = split_prompt(prompt)
    if motion is None:
        motion = split_prompt(f"{image} still")[1]
    return image, motion


def _check_prompt(request: Request) -> None:
    _parts(request.prompt)


def _settings(state: Mapping[str, Any]) -> dict[str, Any]:
    return {"seed": state["seed"], "num_steps": state["num_steps"], "guidance": state["guidance"]}


def _text_to_image(state: Mapping[str, Any]) -> Request:
    return Request("flux-t2i", prompt=_parts(state["prompt"])[0], **_settings(state))


def _image_to_video(state: Mapping[str, Any]) -> Request:
    return Request("wan-i2v", prompt=_parts(state["prompt"])[1], image=state["t2i:image"], **_settings(state))


def _on(model: str, default: str, stage: Callable[[Mapping[str, Any]], Request]):
    """``stage`` (which requests ``default``) sending its request to ``model`` instead."""
    return stage if model == default else (lambda s: stage(s).replace(model=model))


def _t2i_i2v_outputs(state: Mapping[str, Any]) -> dict[str, Any]:
    return {"video": state["i2v:video"], "image": state["t2i:image"]}


def t2i_i2v(t2i: str = "flux-t2i", i2v: str = "wan-i2v", workflow_id: str = "image_video.t2i_i2v") -> Workflow:
    """Text -> image -> video across two cards.

    ``t2i`` renders the image part of the prompt (``split_prompt``); ``i2v`` animates that image
    with the motion part (``"<digit> still"`` if the prompt names no motion). Artifacts:
    ``"video"`` ``(T, H, W, C)`` and ``"image"`` ``(H, W, C)``, both in [0, 1], plus the stages'
    own (``"t2i:text"``, ``"i2v:latents"``, ...).

    Args:
        t2i: the text-to-image card's id.
        i2v: the image-to-video card's id.
        workflow_id: the workflow's id.

    Returns:
        The workflow; a request without a prompt, or with words outside the digits vocabulary, fails its check
        (ValueError).
    """
    text_to_image = _on(t2i, "flux-t2i", _text_to_image)
    image_to_video = _on(i2v, "wan-i2v", _image_to_video)
    return Workflow(
        id=workflow_id,
        stages=(Stage("t2i", t2i, text_to_image), Stage("i2v", i2v, image_to_video)),
        outputs=_t2i_i2v_outputs,
        check=_check_prompt,
        description=f"text -> image ({t2i}) -> video ({i2v})",
    )


def _extend(state: Mapping[str, Any]) -> Request:
    last = state["base:video"][-1]
    return Request(
        "wan-i2v",
        prompt=_parts(state["prompt"])[1],
        image=last,
        **{**_settings(state), "seed": (state["seed"] + 1) % (MAX_SEED + 1)},
    )


def _extended_outputs(state: Mapping[str, Any]) -> dict[str, Any]:
    import jax.numpy as jnp

    video = jnp.concatenate([state["base:video"], state["more:video"][1:]], axis=0)
    return {"video": video, "image": state["base:image"]}


def t2i_i2v_extended(base: str = "image_video.t2i_i2v", workflow_id: str = "image_video.t2i_i2v_extended") -> Workflow:
    """A nested workflow: run ``base`` (text -> image -> video), then animate its last frame again
    with the same motion and join the clips: ``"video"`` ``(2T - 1, H, W, C)``.

    The second clip is ``wan-i2v``'s from ``base``'s last frame (seed + 1); its first frame, that last frame
    again, is dropped when joining.

    Args:
        base: the id of the text -> image -> video workflow to extend.
        workflow_id: the workflow's id.

    Returns:
        The workflow; its artifacts are ``"video"`` and ``base``'s ``"image"``.
    """
    return Workflow(
        id=workflow_id,
        stages=(
            Stage("base", base, lambda s: Request(base, prompt=s["prompt"], **_settings(s))),
            Stage("more", "wan-i2v", _extend),
        ),
        outputs=_extended_outputs,
        check=_check_prompt,
        description=f"{base}, then its last frame animated again (twice as long)",
    )


def _continue(state: Mapping[str, Any]) -> Request:
    inputs = {"video": state["t2v:video"]}
    if state.get("chunks") is not None:
        inputs["chunks"] = state["chunks"]
    return Request(
        "wan-causal",
        prompt=state["prompt"],
        inputs=inputs,
        **{**_settings(state), "seed": (state["seed"] + 1) % (MAX_SEED + 1)},
    )


def _continued_outputs(state: Mapping[str, Any]) -> dict[str, Any]:
    import jax.numpy as jnp

    first = state["t2v:video"]
    return {"video": jnp.concatenate([first, state["more:video"][first.shape[0] :]], axis=0)}


def _check_video_prompt(request: Request) -> None:
    if request.prompt is None:
        raise ValueError("video.t2v_continue needs a prompt, e.g. prompt='seven moving right'")


def t2v_continue(t2v: str = "wan-t2v", causal: str = "wan-causal", workflow_id: str = "video.t2v_continue") -> Workflow:
    """Video continuation: ``t2v`` renders a video from the prompt, then ``causal`` extends it by more chunks
    conditioned on all of its frames (prefilled into its chunk KV cache). ``inputs={"chunks": n}`` sets
    how many (default the causal card's). Artifacts: ``"video"`` ``(T + n·F, H, W, C)`` in [0, 1] (the
    first video's frames exactly, then the new ones), plus ``"t2v:video"``, ``"more:video"`` ...

    Args:
        t2v: the text-to-video card's id.
        causal: the causal (chunked) video card's id; it continues with seed + 1.
        workflow_id: the workflow's id.

    Returns:
        The workflow; a request without a prompt fails its check (ValueError).
    """
    first = lambda s: Request(t2v, prompt=s["prompt"], **_settings(s))
    more = _on(causal, "wan-causal", _continue)
    return Workflow(
        id=workflow_id,
        stages=(Stage("t2v", t2v, first), Stage("more", causal, more)),
        outputs=_continued_outputs,
        check=_check_video_prompt,
        description=f"text -> video ({t2v}), then continued chunk by chunk ({causal})",
    )


def register() -> None:
    """Ship the three workflows with ``Engine.default()``."""
    for factory in (t2i_i2v, t2i_i2v_extended, t2v_continue):
        register_bundled(factory().id, factory)
