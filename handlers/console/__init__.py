"""The operator console (`GET /console`): server-rendered pages over the same `core`
functions as the API, a browser session in place of a bearer token, and the few
assets it needs, served from this package. `handlers.console.routes` wires it."""
