"""Reward: rule checks in-process, an LLM judge or any scorer behind a serverless endpoint."""
