"""The OpenAI-compatible Chat Completions wire: request building, chunk parsing, error reading, the client."""
