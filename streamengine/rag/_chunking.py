"""From tool results to what a store indexes: deterministic passages and their embeddings.

Deterministic splitting of tool results into passages for the store.

Paragraph, then sentence, then word boundaries, with an overlap of whole
words: the same text always gives the same chunks, so re-filing is idempotent.

Embedders: a provider's ``/v1/embeddings`` and a local hashing one.

``OpenAIEmbedder`` duck-types ``client.embed`` so this package never imports
the clients; ``HashingEmbedder`` is deterministic, for tests and offline use.
"""
from __future__ import annotations

import hashlib
import math
import re
from typing import List, Optional, Protocol, Sequence, SupportsFloat, Tuple

from .. import _validation as validation
from .._errors import ConfigError, LlmProtocolError
from ._base import _TOKEN_RE

# ---------------------------------------------------------------------------
# Chunking
# ---------------------------------------------------------------------------

_WORD_RE = re.compile(r"\S+")
# A word ending in . ! ? or an ellipsis, maybe followed by closing quotes or
# brackets, ends a sentence.  Crude on purpose ("e.g." ends one too): it only
# chooses where a chunk may end, and determinism matters more than linguistics.
_SENTENCE_END_RE = re.compile(r"[.!?\u2026\u3002\uff01\uff1f][\"'\u201d\u2019)\]]*$")
_WORD_BREAK, _SENTENCE_BREAK, _PARAGRAPH_BREAK = 1, 2, 3

_Span = Tuple[int, int]


def chunks_for_ingest(text: str, chunk_size: int = 800, overlap: int = 100) -> List[str]:
    """Split ``text`` into chunks of at most ``chunk_size`` characters for retrieval.

    Boundaries are chosen in order of preference: paragraphs (a blank line),
    then sentences (a word ending in ``.``, ``!``, ``?`` -- a single line
    break counts as a sentence end too, which suits lists, logs and tables),
    then words.  Small paragraphs are packed together; a paragraph too big for
    one chunk is split on its own, so its pieces never share a chunk with a
    neighbouring paragraph.

    Each chunk after the first starts with up to ``overlap`` characters of
    whole words from the end of the previous chunk (fewer when the next
    piece would not fit otherwise), so a phrase cut by a boundary is still
    found whole.  A word is never cut: a single word longer than
    ``chunk_size`` (a URL, a base64 blob) becomes a chunk of its own, longer
    than ``chunk_size``, with no overlap.

    Every chunk is a verbatim slice of ``text`` (inner whitespace kept), so a
    hit can be found again in its source.  The result is deterministic;
    empty or whitespace-only text gives ``[]``.
    """
    _check_chunk_args(text, chunk_size, overlap)
    return [text[start:end] for start, end in _chunk_spans(text, chunk_size, overlap)]


def _check_chunk_args(text: object, chunk_size: object, overlap: object) -> None:
    if not isinstance(text, str):
        raise ConfigError(f"chunks_for_ingest needs text as str, got {type(text).__name__}")
    size = validation.count(chunk_size, "chunk_size (characters)", minimum=1)
    if validation.count(overlap, "overlap") >= size:
        raise ConfigError(
            f"overlap must be an int with 0 <= overlap < chunk_size ({chunk_size}), got {overlap!r}"
        )


def _chunk_spans(text: str, size: int, overlap: int) -> List[_Span]:
    """Character spans ``(start, end)`` of each chunk, overlap included."""
    words = [m.span() for m in _WORD_RE.finditer(text)]
    if not words:
        return []
    if words[-1][1] - words[0][0] <= size:
        return [(words[0][0], words[-1][1])]
    breaks = _break_strengths(text, words)
    groups: List[List[_Span]] = []
    _split(words, breaks, 0, len(words), size, groups)
    return [(words[first][0], words[end - 1][1]) for first, end in _pack(words, groups, size, overlap)]


def _break_strengths(text: str, words: Sequence[_Span]) -> List[int]:
    """``strengths[i]``: how good a place the gap before word ``i`` is to end a chunk."""
    strengths = [0]
    for i in range(1, len(words)):
        newlines = text.count("\n", words[i - 1][1], words[i][0])
        if newlines >= 2:
            strengths.append(_PARAGRAPH_BREAK)
        elif newlines == 1 or _SENTENCE_END_RE.search(text, words[i - 1][0], words[i - 1][1]):
            strengths.append(_SENTENCE_BREAK)
        else:
            strengths.append(_WORD_BREAK)
    return strengths


def _split(words: Sequence[_Span], breaks: Sequence[int], i: int, j: int, size: int,
           groups: List[List[_Span]]) -> None:
    """Cut words[i:j] (too big for one chunk) at its strongest breaks.

    Appends groups of units (word-index ranges); units of one group may be
    packed into one chunk, a new group always starts a new chunk.  A part
    still too big is cut again at the next weaker breaks, in a group of its
    own: that is what keeps a big paragraph's pieces apart from its
    neighbours.  Depth is bounded by the three break strengths.
    """
    level = max(breaks[i + 1:j])
    cuts = [i] + [m for m in range(i + 1, j) if breaks[m] == level] + [j]
    group: List[_Span] = []
    for a, b in zip(cuts, cuts[1:]):
        if b - a == 1 or words[b - 1][1] - words[a][0] <= size:
            group.append((a, b))
            continue
        if group:
            groups.append(group)
            group = []
        _split(words, breaks, a, b, size, groups)
    if group:
        groups.append(group)


def _pack(words: Sequence[_Span], groups: Sequence[Sequence[_Span]], size: int,
          overlap: int) -> List[_Span]:
    """Greedily pack units into chunks; returns word-index ranges ``(first, end)``."""
    chunks: List[_Span] = []
    for group in groups:
        current: Optional[_Span] = None
        for a, b in group:
            if current is not None and words[b - 1][1] - words[current[0]][0] <= size:
                current = (current[0], b)
                continue
            if current is not None:
                chunks.append(current)
            previous = chunks[-1] if chunks else None
            current = (_overlap_start(words, previous, a, b, size, overlap), b)
        if current is not None:
            chunks.append(current)
    return chunks


def _overlap_start(words: Sequence[_Span], previous: Optional[_Span], a: int, b: int,
                   size: int, overlap: int) -> int:
    """First word of a chunk whose new text is words[a:b]: reach back into ``previous``.

    Takes as many of the previous chunk's last words as stay within
    ``overlap`` characters and keep the chunk within ``size``.
    """
    if previous is None or overlap == 0:
        return a
    first, end = previous
    tail_end, chunk_end = words[end - 1][1], words[b - 1][1]
    start = a
    for w in range(end - 1, first - 1, -1):
        word_start = words[w][0]
        if tail_end - word_start > overlap or chunk_end - word_start > size:
            break
        start = w
    return start


# ---------------------------------------------------------------------------
# Embedders
# ---------------------------------------------------------------------------


class EmbeddingClient(Protocol):
    """What :class:`OpenAIEmbedder` needs of a client: ``OpenAICompatibleClient.embed``."""

    def embed(self, texts: Sequence[str], model: str, /) -> Sequence[Sequence[SupportsFloat]]: ...


class OpenAIEmbedder:
    """Embeds through a provider's ``/v1/embeddings`` via ``client.embed(texts, model)``.

    Requests are batched (``batch_size`` texts each) because providers cap
    the inputs of one request.  Any client error propagates: the store
    decides what a failure means (it logs and keeps the text).
    """

    def __init__(self, client: EmbeddingClient, model: str, batch_size: int = 64) -> None:
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
