"""taskward's domain: tables, state machine, store operations, auth, models, engines.

Nothing here knows about HTTP or the command line.
"""
