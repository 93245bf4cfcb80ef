"""Provider clients: the boundary where HTTP and third-party errors become ours."""
from .base import LlmClient, StreamingLlmClient
from .openai import OpenAICompatibleClient
from .scripted import ScriptedClient

__all__ = ["LlmClient", "OpenAICompatibleClient", "ScriptedClient", "StreamingLlmClient"]
