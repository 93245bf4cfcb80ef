"""Retrieval store: what the tools fetched becomes searchable in the same request.

The engine files every successful tool result (``chunks_for_ingest`` then
``RagStore.add_chunks``, or one ``add_many`` for all that wait) so that a
later ``rag_search`` -- in the same continuation round or a later one --
finds it.

- ``_chunking``: :func:`chunks_for_ingest`;
- ``_base``: :class:`RagStore` and :class:`Embedder` protocols, :class:`Hit`, :class:`Filing`,
  the query words and rank fusion every store shares;
- ``_embedders``: :class:`OpenAIEmbedder`, :class:`HashingEmbedder`;
- ``_sqlite``: :class:`SqliteRagStore`, the embedded default;
- ``_postgres``: :class:`PostgresRagStore`, one store shared by many processes
  (psycopg is imported only when one is made);
- ``_base``: also the built-in ``rag_search`` tool.

Layering: this package depends only on ``_errors``/``_logs``/``tools`` and the
standard library; ``OpenAIEmbedder`` duck-types ``client.embed``.
"""
from ._base import Embedder as Embedder
from ._base import Filing as Filing
from ._base import Hit as Hit
from ._base import RagStore as RagStore
from ._chunking import EmbeddingClient as EmbeddingClient
from ._chunking import HashingEmbedder as HashingEmbedder
from ._chunking import OpenAIEmbedder as OpenAIEmbedder
from ._chunking import chunks_for_ingest as chunks_for_ingest
from ._postgres import PostgresRagStore as PostgresRagStore
from ._sqlite import SqliteRagStore as SqliteRagStore

__all__ = [
    "Embedder", "EmbeddingClient", "Filing", "HashingEmbedder", "Hit", "OpenAIEmbedder", "PostgresRagStore", "RagStore",
    "SqliteRagStore", "chunks_for_ingest",
]
