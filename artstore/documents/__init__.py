"""The documents a recorded LLM call's blobs hold, written by capture, read by projections.

`messages`: LangChain messages as JSON (what `art.langgraph` logs); `exchanges`: the
request and response of an OpenAI-compatible HTTP call, as ART's own capture keeps them.
"""
