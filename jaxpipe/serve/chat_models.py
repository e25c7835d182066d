"""Which served models can chat, and how: a card whose program decodes text in an ``ar_decode`` loop, or an
image-reading text program of its family served next to it (``bagel-mot:understand``), and the text a loop's
token buffer holds. The route itself is ``chat.py``'s.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from jaxpipe import io
from jaxpipe.program import LoopNode
from jaxpipe.serve.errors import APIError

__all__ = ["ChatModel", "chat_models", "register_text_programs", "reply_text", "resolve"]

_REGISTER = threading.Lock()


@dataclasses.dataclass(frozen=True)
class ChatModel:
    """What a chat runs: the engine id to submit to, the text loop whose buffer is the reply, and its shape.

    Attributes:
      served: the engine's model id (``"unified"``, ``"bagel-mot:understand"``).
      loop: the ``ar_decode`` loop's id.
      max_new_tokens: the loop's steps (the most ``max_tokens`` a request may ask).
      eos_id: the loop's ``<eos>`` id.
      reads_image: whether the program reads an image.
      image_shape: the ``(H, W, C)`` the card reads images at (``None``: the image's own size).
    """

    served: str
    loop: str
    max_new_tokens: int
    eos_id: int
    reads_image: bool
    image_shape: tuple[int, int, int] | None


def _text_loop(card, program) -> str | None:
    """The first ``ar_decode`` loop of ``program`` on ``card`` when the program returns text, else ``None``."""
    if not program.texts:
        return None
    for node in program.nodes:
        if isinstance(node, LoopNode) and card.spec.loop(node.loop).kind == "ar_decode":
            return node.loop
    return None


def _chat_model(engine, model_id: str) -> ChatModel | None:
    card, program = engine.card(model_id), engine.program(model_id)
    loop = _text_loop(card, program)
    if loop is None:
        return None
    config = card.spec.loop(loop).config
    return ChatModel(
        model_id, loop, int(config.max_new_tokens), int(config.eos_id), "image" in program.inputs, io.image_shape(card)
    )


def _image_programs(card) -> dict[str, Any]:
    """``{name: Program}``: the programs of ``card``'s family that fit it, read an image and decode text."""
    from jaxpipe import cards
    from jaxpipe.program import ProgramError

    found = {}
    try:
        family = cards.family_of(card)
    except (KeyError, ValueError):
        return found
    for name, factory in family.programs.items():
        program = factory()
        try:
            program.check(card)
        except ProgramError:
            continue
        if "image" in program.inputs and _text_loop(card, program) is not None:
            found[name] = program
    return found


def _register_variant(engine, base: str, name: str) -> str | None:
    """Serve ``base``'s family program ``name`` (one that reads an image and decodes text) as
    ``f"{base}:{name}"`` on the resident card's weights, unless it is already served; its id, or ``None``."""
    model_id = f"{base}:{name}"
    with _REGISTER:
        if engine.serves(model_id):
            return model_id
        if base not in engine.cards():
            return None
        card = engine.card(base)
        program = _image_programs(card).get(name)
        if program is None:
            return None
        engine.register(card, program, model_id=model_id)
    return model_id


def register_text_programs(engine) -> list[str]:
    """Serve, next to every resident card, its family's image-reading text programs (``bagel-mot``:
    ``understand`` as ``bagel-mot:understand``), so ``GET /v1/models`` lists them before a chat needs one.

    Args:
      engine: the server's ``Engine``.

    Returns:
      The ids registered (or already served).
    """
    ids = []
    for base in engine.cards():
        if ":" in base:
            continue
        for name in _image_programs(engine.card(base)):
            if (served := _register_variant(engine, base, name)) is not None:
                ids.append(served)
    return ids


def chat_models(engine) -> list[str]:
    """The ids a chat may name: served cards whose program decodes text, the ``"<card>:<program>"``
    image-reading text programs among them (``register_text_programs`` serves those).

    Args:
      engine: the engine behind the server.

    Returns:
      The ids, sorted.
    """
    ids = set()
    for model_id in engine.cards():
        if _chat_model(engine, model_id) is not None:
            ids.add(model_id)
    return sorted(ids)


def _cannot_chat(engine, model: str, why: str) -> APIError:
    return APIError(
        400,
        f"{why}; the models that can chat: {', '.join(chat_models(engine)) or 'none'}",
        param="model",
        code="model_not_chat",
    )


def resolve(engine, model: str, with_image: bool) -> ChatModel:
    """The ``ChatModel`` a chat with ``model`` runs (an image in the message picks an image-reading program).

    Args:
      engine: the server's ``Engine``.
      model: the requested id (a card, or ``"<card>:<program>"``).
      with_image: whether the message holds an image.

    Returns:
      The ``ChatModel``.

    Raises:
      APIError: 404 for an id the engine does not serve (listing them); 400 naming the models that can
        chat for one without a text loop, an image sent to a program that reads none, or none sent to one
        that needs it.
    """
    if not engine.serves(model):
        raise APIError(
            404,
            f"unknown model {model!r}; this server serves {', '.join(engine.models())} "
            f"(chat: {', '.join(chat_models(engine)) or 'none'})",
            param="model",
            code="model_not_found",
        )
    if model not in engine.cards():
        raise _cannot_chat(engine, model, f"{model!r} is a workflow: it decodes no text")
    chat = _chat_model(engine, model)
    if with_image and (chat is None or not chat.reads_image):
        readers = [f"{model}:{name}" for name in _image_programs(engine.card(model))]
        served = [model_id for model_id in readers if engine.serves(model_id)]
        if served:
            chat = _chat_model(engine, served[0])
        elif readers:
            raise _cannot_chat(engine, model, f"{model!r} reads images through a program this server does not serve")
        elif chat is not None:
            raise _cannot_chat(engine, model, f"{model!r} reads no image: send text only")
    if chat is None:
        raise _cannot_chat(engine, model, f"{model!r} has no text loop to chat with")
    if not with_image and chat.reads_image:
        raise APIError(
            400,
            f"{model!r} reads an image: put one in the user message as an image_url part "
            f"(a data:image/png;base64,... URL)",
            param="messages",
            code="image_required",
        )
    return chat


def reply_text(tokenizer, buffer: np.ndarray, eos_id: int) -> str:
    """The text a text loop's token buffer holds: ``<eos>``, ``<pad>`` and ids outside the vocabulary
    dropped, the words decoded in order (what a program's text artifact holds for the bundled cards).

    Args:
      tokenizer: the card's tokenizer (``card.spec.tokenizer``).
      buffer: the loop's token buffer ``(max_len,)`` int.
      eos_id: the loop's ``<eos>`` id.

    Returns:
      The text.
    """
    ids = np.asarray(buffer).reshape(-1)
    words = ids[(ids != eos_id) & (ids > 0) & (ids < tokenizer.vocab_size)]
    return tokenizer.decode(words[None].astype(np.int32))[0] if words.size else ""
