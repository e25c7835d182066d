"""Real prompts -> token ids for the real text encoders, from a transformers tokenizer folder.

``HFTokenizer.from_folder`` reads the folder's ``tokenizer.json`` with the ``tokenizers`` library
(FLUX's ``tokenizer_2/`` (T5), Wan's ``tokenizer/`` (UMT5)), plus the pad token and padding /
truncation sides from ``tokenizer_config.json`` / ``special_tokens_map.json``. A CLIP folder that
ships only ``vocab.json`` + ``merges.txt`` (FLUX's ``tokenizer/``) is assembled the way
transformers' ``CLIPTokenizer`` assembles it. Calling it pads and truncates every prompt to
``max_length`` as the pipelines' ``tokenizer(prompts, padding="max_length", truncation=True,
max_length=...)`` does (special tokens included: CLIP's start/end-of-text, T5's closing ``</s>``).

Tokenising is optional: the encoders take token ids, so ids from any other tokenizer (or cached
ones) can be passed to them directly, with a ``(B, L)`` mask of real tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["HFTokenizer", "TokenizerSpec"]

_CLIP_CLASSES = ("CLIPTokenizer", "CLIPTokenizerFast")
_CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(value: Any) -> str | None:
    """A special token as saved by transformers: a string or an ``AddedToken`` dict."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value


def _side(value: Any, name: str) -> str:
    side = str(value or "right").lower()
    if side not in ("left", "right"):
        raise ValueError(f"{name} must be 'left' or 'right' (got {value!r})")
    return side


def _clip_pad(settings: Mapping[str, Any]) -> str:
    return _token_text(settings.get("pad_token")) or "<|endoftext|>"  # CLIPTokenizer's default


def _clip_backend(folder: Path, settings: Mapping[str, Any]):
    """transformers' ``CLIPTokenizer`` pipeline over ``vocab.json`` + ``merges.txt``: NFC, whitespace
    runs to one space, lowercase; CLIP's word split then byte-level BPE with ``</w>`` word ends;
    ``<|startoftext|> ... <|endoftext|>`` around each prompt."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    unk = _token_text(settings.get("unk_token")) or "<|endoftext|>"
    bos = _token_text(settings.get("bos_token")) or "<|startoftext|>"
    eos = _token_text(settings.get("eos_token")) or "<|endoftext|>"
    vocab, merges = models.BPE.read_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
            fuse_unk=False,
            unk_token=unk,
        )
    )
    backend.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    # added tokens as the config lists them (with their matching options), then any named
    # special token still missing, as transformers adds them
    added = []
    for _, spec in sorted(settings.get("added_tokens_decoder", {}).items(), key=lambda item: int(item[0])):
        options = {k: spec[k] for k in ("single_word", "lstrip", "rstrip", "normalized", "special") if k in spec}
        added.append(AddedToken(spec["content"], **options))
    present = {str(t) for t in added}
    for token in dict.fromkeys([bos, eos, unk, _clip_pad(settings)]):
        if token not in present:
            added.append(AddedToken(token, special=True))
    backend.add_tokens(added)
    for token in (bos, eos):
        if backend.token_to_id(token) is None:
            raise ValueError(f"{folder}: the CLIP vocabulary has no {token!r}")
    backend.post_processor = processors.RobertaProcessing(
        (eos, backend.token_to_id(eos)), (bos, backend.token_to_id(bos)), trim_offsets=False, add_prefix_space=False
    )
    return backend


class HFTokenizer:
    """A transformers tokenizer folder's tokenizer, batch-encoding to fixed-length id / mask arrays.

    Only the ``tokenizers`` library is needed. ``backend`` (a ``tokenizers.Tokenizer``) becomes this
    object's own: its padding and truncation are set on every call. The encoders also accept
    token ids made any other way.
    """

    def __init__(
        self,
        backend,
        *,
        pad_token: str,
        padding_side: str = "right",
        truncation_side: str = "right",
        split_special_tokens: bool = False,
    ):
        self._backend = backend
        self._backend.encode_special_tokens = bool(split_special_tokens)
        pad_id = self._backend.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"pad token {pad_token!r} is not in the tokenizer's vocabulary")
        self.pad_token, self.pad_id = pad_token, int(pad_id)
        self.padding_side = _side(padding_side, "padding_side")
        self.truncation_side = _side(truncation_side, "truncation_side")

    @classmethod
    def from_folder(cls, folder: str | Path) -> HFTokenizer:
        """The tokenizer of a transformers tokenizer folder (``tokenizer.json``, or CLIP's
        ``vocab.json`` + ``merges.txt``); the pad token and sides from its config files."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such tokenizer folder")
        settings = {**_read_json(folder / "special_tokens_map.json"), **_read_json(folder / "tokenizer_config.json")}
        if (folder / "tokenizer.json").is_file():
            backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        elif (
            (folder / "vocab.json").is_file()
            and (folder / "merges.txt").is_file()
            and settings.get("tokenizer_class") in _CLIP_CLASSES
        ):
            backend = _clip_backend(folder, settings)
            settings = {**settings, "pad_token": _clip_pad(settings)}
        else:
            models = sorted(p.name for p in folder.glob("*.model"))
            what = f"only a SentencePiece model ({', '.join(models)})" if models else "no tokenizer.json"
            raise FileNotFoundError(
                f"{folder}: {what}. jaxpipe reads tokenizer.json; write it once with transformers "
                f"(`AutoTokenizer.from_pretrained(folder).save_pretrained(folder)`, which needs the sentencepiece "
                f"package for a SentencePiece model), or tokenise elsewhere and pass token ids to the encoder"
            )
        json_padding = backend.padding or {}
        json_truncation = backend.truncation or {}
        pad_token = _token_text(settings.get("pad_token")) or json_padding.get("pad_token")
        if not pad_token:
            raise ValueError(
                f"{folder}: the tokenizer names no pad token (tokenizer_config.json 'pad_token'); "
                f"padding to max_length needs one"
            )
        return cls(
            backend,
            pad_token=pad_token,
            padding_side=_side(settings.get("padding_side") or json_padding.get("direction"), "padding_side"),
            truncation_side=_side(
                settings.get("truncation_side") or json_truncation.get("direction"), "truncation_side"
            ),
            split_special_tokens=bool(settings.get("split_special_tokens", False)),
        )

    @property
    def spec(self) -> TokenizerSpec:
        """This tokenizer as a hashable, JSON-able value (a card config stores it; ``spec.load()`` rebuilds it)."""
        return TokenizerSpec(
            self._backend.to_str(),
            self.pad_token,
            self.padding_side,
            self.truncation_side,
            bool(self._backend.encode_special_tokens),
        )

    @property
    def num_special_tokens(self) -> int:
        """Special tokens added around one prompt (CLIP 2, T5 1)."""
        return self._backend.num_special_tokens_to_add(False)

    def __call__(self, prompts: str | Sequence[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, mask)``, both ``(B, max_length)`` int32: each prompt's ids with its special tokens,
        truncated to ``max_length`` and padded with the pad token; ``mask`` is 1 on real tokens."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        bad = [type(p).__name__ for p in prompts if not isinstance(p, str)]
        if bad:
            raise TypeError(f"prompts must be strings (got {', '.join(sorted(set(bad)))})")
        if not isinstance(max_length, (int, np.integer)) or max_length <= self.num_special_tokens:
            raise ValueError(
                f"max_length must be an int above the {self.num_special_tokens} special token(s) "
                f"each prompt gets (got {max_length!r})"
            )
        max_length = int(max_length)
        self._backend.enable_truncation(max_length, stride=0, strategy="longest_first", direction=self.truncation_side)
        self._backend.enable_padding(
            direction=self.padding_side, pad_id=self.pad_id, pad_token=self.pad_token, length=max_length
        )
        encodings = self._backend.encode_batch(prompts, add_special_tokens=True)
        ids = np.asarray([e.ids for e in encodings], np.int32).reshape(len(prompts), max_length)
        mask = np.asarray([e.attention_mask for e in encodings], np.int32).reshape(len(prompts), max_length)
        return ids, mask


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """A tokenizer as plain data: the ``tokenizers`` JSON (``Tokenizer.to_str()``), the pad token and
    the padding / truncation sides. Hashable and equal by content, so a card's static spec can hold it."""

    json: str
    pad_token: str
    padding_side: str = "right"
    truncation_side: str = "right"
    split_special_tokens: bool = False

    @classmethod
    def from_folder(cls, folder: str | Path) -> TokenizerSpec:
        """The spec of a transformers tokenizer folder (``HFTokenizer.from_folder``'s ``spec``).

        Raises:
          FileNotFoundError: as ``HFTokenizer.from_folder``.
        """
        return HFTokenizer.from_folder(folder).spec

    def load(self) -> HFTokenizer:
        """The tokenizer (built once per spec)."""
        return _load_spec(self)


@functools.lru_cache(maxsize=16)
def _load_spec(spec: TokenizerSpec) -> HFTokenizer:
    from tokenizers import Tokenizer

    return HFTokenizer(
        Tokenizer.from_str(spec.json),
        pad_token=spec.pad_token,
        padding_side=spec.padding_side,
        truncation_side=spec.truncation_side,
        split_special_tokens=spec.split_special_tokens,
    )
