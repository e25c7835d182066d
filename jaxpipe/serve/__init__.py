"""``jaxpipe serve``: an OpenAI-compatible HTTP server over the engine (install with ``pip install "jaxpipe[serve]"``).

``front`` (the ``Front``: a background thread ticking the engine, admission by a ``Budget``, a bounded
wait window), ``app`` (``create_app``: the FastAPI app and its routes), ``server`` (uvicorn with a
graceful SIGTERM drain), ``metrics`` (Prometheus), ``media`` (PNG / GIF bytes, request images),
``chat`` and ``rewards`` (their routes), ``errors`` (OpenAI-style error envelopes). Nothing is imported
here, so ``jaxpipe`` itself never needs the serve extra.
"""

__all__: list[str] = []
