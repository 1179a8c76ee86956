"""Store operations: every state change of a task is one transaction, fenced where
SPEC section 4 says, on SQLite and PostgreSQL alike (`database` hides the difference)."""
