"""The capture addon's library, one concern per module: what to ask vLLM for (`plan`), what the client sees
(`strip`, `client_view`), what the upstream said (`assemble`) and the record of a finished flow (`record`). They know
vLLM's wire format and read flows, but know nothing of hooks or storage.
"""
