"""Wiring: the served app, migrations, the cold-start hook, the CLI and deployment."""
