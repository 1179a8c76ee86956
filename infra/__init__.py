"""Wiring: database engines, migrations, the cold-start hook, the CLI and deployment."""
