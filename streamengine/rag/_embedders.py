"""Embedders: a provider's ``/v1/embeddings`` and a local hashing one.

``OpenAIEmbedder`` duck-types ``client.embed`` so this package never imports
the clients; ``HashingEmbedder`` is deterministic, for tests and offline use.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, List, Optional, Sequence

from .. import _validation as validation
from .._errors import ConfigError, LlmProtocolError
from ._base import _TOKEN_RE

# ---------------------------------------------------------------------------
# Embedders
# ---------------------------------------------------------------------------


class OpenAIEmbedder:
    """Embeds through a provider's ``/v1/embeddings`` via ``client.embed(texts, model)``.

    Requests are batched (``batch_size`` texts each) because providers cap
    the inputs of one request.  Any client error propagates: the store
    decides what a failure means (it logs and keeps the text).
    """

    def __init__(self, client: Any, model: str, batch_size: int = 64) -> None:
        if not callable(getattr(client, "embed", None)):
            raise ConfigError(
                f"OpenAIEmbedder needs a client with embed(texts, model), got {type(client).__name__}; "
                "pass an OpenAICompatibleClient"
            )
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"OpenAIEmbedder needs an embedding model name, got {model!r}")
        validation.count(batch_size, "batch_size", minimum=1)
        self.client = client
        self.model = model
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str], model: Optional[str] = None) -> List[List[float]]:
        """One vector per text, in order; ``model`` overrides the default for this call."""
        texts = list(texts)
        use = model or self.model
        vectors: List[List[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start:start + self.batch_size]
            got = self.client.embed(batch, use)
            if len(got) != len(batch):
                raise LlmProtocolError(
                    f"embedding model {use!r} returned {len(got)} vectors for {len(batch)} inputs; "
                    "the provider's /embeddings answer is incomplete"
                )
            vectors.extend([float(x) for x in vector] for vector in got)
        return vectors


class HashingEmbedder:
    """A deterministic local embedder: a bag of hashed words, L2-normalised.

    Each lower-cased word is hashed (BLAKE2b, so it is stable across
    processes, unlike ``hash()``) to one of ``dim`` buckets with a +1/-1 sign
    (feature hashing).  It knows no synonyms -- texts are similar when they
    share words -- but it needs no network, which makes it right for tests
    and offline use.  A text without words gives the zero vector.
    """

    def __init__(self, dim: int = 64) -> None:
        validation.count(dim, "HashingEmbedder dim", minimum=1)
        self.dim = dim
        self.model = f"hashing-{dim}"

    def embed(self, texts: Sequence[str], model: Optional[str] = None) -> List[List[float]]:
        """One unit vector per text; ``model`` is accepted for the protocol and ignored."""
        return [self._embed_one(text) for text in texts]

    def _embed_one(self, text: str) -> List[float]:
        vector = [0.0] * self.dim
        for word in _TOKEN_RE.findall(text.lower()):
            value = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
            vector[value % self.dim] += -1.0 if value >> 63 else 1.0
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector] if norm else vector


