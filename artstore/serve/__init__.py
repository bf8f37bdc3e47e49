"""`artstore serve`: a recording OpenAI-compatible proxy and a rollout API over HTTP.

An agent anywhere (another language, a sandbox, a container with only an HTTP route out)
is given a base URL; every call it makes there is forwarded to the upstream inference
server and recorded as the `llm.call` events in-process capture writes. `tokens.py`
admits clients, `rollouts.py` keeps the rollouts this process serves, `proxy.py` relays
and records calls, `api.py` is the rollout API, `app.py` puts them together and
`server.py` runs it under uvicorn.
"""
