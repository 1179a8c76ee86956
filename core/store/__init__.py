"""The one place that talks to a database: every statement taskward runs is a named
function here, each state change of a task one transaction, fenced as
docs/state-machine.md says, on SQLite and PostgreSQL alike (`database` hides the
difference behind named abilities; `connect` opens it). The modules beside `core/store`
decide what to write; these write it."""
