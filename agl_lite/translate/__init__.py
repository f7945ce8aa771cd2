"""API translations: what a client speaks (the Anthropic Messages API, the OpenAI Responses API) to the chat
completions the upstream serves, and back, byte for byte where the client sees it (`chunks` reads the upstream's
event stream for both). Wire formats only: nothing here knows flows, hooks or storage.
"""
