"""Provider clients: the boundary where HTTP and third-party errors become ours."""
from .base import LlmClient, StreamingLlmClient

__all__ = ["LlmClient", "StreamingLlmClient"]
