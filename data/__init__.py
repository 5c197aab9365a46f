"""Data preparation scripts (tokenizers, tiny Shakespeare, FineWeb, the passkey set); run them from the repo root."""
