"""Helpers of the capture addon, one concern per module: what the client sees (`strip`), what gets recorded
(`assemble`). They know vLLM's wire format but nothing of flows, hooks or storage.
"""
