"""API translations: what a client speaks (the Anthropic Messages API) to the chat completions the upstream serves,
and back, byte for byte where the client sees it. Wire formats only: nothing here knows flows, hooks or storage.
"""
