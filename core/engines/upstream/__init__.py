"""The `openai` engine: taskward as the durable front of an OpenAI-compatible server.

`hosts` decides which URLs may be used at all, `transport` owns the process's one HTTP
client, `routing` picks a base URL per attempt (fewest in flight, cool-downs),
`protocol` speaks Chat Completions streaming, and `engine` ties them into the engine
contract of `core.engines.base`. docs/upstream.md is the operator's view.
"""
