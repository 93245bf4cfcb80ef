"""Provider clients: the boundary where HTTP and third-party errors become ours."""
from .anthropic import AnthropicClient
from .base import LlmClient, StreamingLlmClient
from .openai import OpenAICompatibleClient
from .routed import RoutedClient
from .scripted import ScriptedClient

__all__ = ["AnthropicClient", "LlmClient", "OpenAICompatibleClient", "RoutedClient", "ScriptedClient",
           "StreamingLlmClient"]
