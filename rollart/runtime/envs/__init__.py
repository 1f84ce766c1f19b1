"""Environments an EnvManager plays against (``base.TextEnv``)."""
