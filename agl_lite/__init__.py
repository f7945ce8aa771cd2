"""agl-lite: a capturing LLM gateway, a rollout store and agent runners for reinforcement learning of LLM agents."""

__version__ = "0.1.0"
