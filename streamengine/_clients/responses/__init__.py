"""OpenAI's Responses wire (``POST /v1/responses``): request translation, answers and errors, stream events, client."""
