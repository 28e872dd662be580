"""The recording gateway: an OpenAI-compatible endpoint that forwards to vLLM and records."""
