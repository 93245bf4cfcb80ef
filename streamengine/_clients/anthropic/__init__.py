"""Anthropic's Messages wire: request format, typed stream events, the client."""
