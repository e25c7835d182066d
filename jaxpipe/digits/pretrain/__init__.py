"""The recipes that pretrain every bundled digits card, reproducibly (fixed seeds: the same machine gives the same bits).

    python -m jaxpipe.digits.pretrain CARD --out DIR [recipe flags]      # e.g. flux-t2i, unified, digit-scorer
    python -m jaxpipe.digits.pretrain CARD --help                        # the recipe's own flags

One module per recipe: ``generators`` (``flux-t2i``, ``wan-i2v``, ``wan-t2v``: autoencoder, then text
encoder + DiT by flow matching), ``lm`` (``unified``'s refiner LM), ``mot`` (``bagel-mot``,
``cosmos3``), ``moe`` (``wan22-moe``), ``causal`` (``wan-causal``), ``ltx2`` (``ltx2-two-stage``),
``scorer`` (the ``digit-scorer`` reward model), ``classifier`` (the independent ``digit-classifier``) and ``distill`` (``flux-t2i-turbo``, DMD2).
"""

from __future__ import annotations

__all__ = ["RECIPES", "main"]

RECIPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "flux-t2i": ("generators", ("flux-t2i",)),
    "wan-i2v": ("generators", ("wan-i2v",)),
    "wan-t2v": ("generators", ("wan-t2v",)),
    "unified": ("lm", ()),
    "bagel-mot": ("mot", ()),
    "cosmos3": ("mot", ("--model-id", "cosmos3")),
    "wan22-moe": ("moe", ()),
    "wan-causal": ("causal", ()),
    "ltx2-two-stage": ("ltx2", ()),
    "digit-scorer": ("scorer", ()),
    "digit-classifier": ("classifier", ()),
    "flux-t2i-turbo": ("distill", ("flux-t2i-turbo",)),
}
"""Card id -> (recipe module, the arguments that pick the card in its command line)."""


def main(argv: list[str] | None = None) -> None:
    """``python -m jaxpipe.digits.pretrain CARD ...``: run card ``CARD``'s recipe with the remaining arguments.

    Args:
        argv: ``[CARD, *recipe flags]`` (default: ``sys.argv[1:]``); ``CARD`` is a key of ``RECIPES``.

    Raises:
        SystemExit: with the usage and the known cards, if ``CARD`` is missing, unknown or ``-h``/``--help``.
    """
    import importlib
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in RECIPES:
        known = ", ".join(RECIPES)
        head = "" if not args or args[0] in ("-h", "--help") else f"unknown card {args[0]!r}\n"
        raise SystemExit(f"{head}usage: python -m jaxpipe.digits.pretrain CARD --out DIR [flags]\ncards: {known}")
    module, picked = RECIPES[args[0]]
    importlib.import_module(f"jaxpipe.digits.pretrain.{module}").main([*picked, *args[1:]])
