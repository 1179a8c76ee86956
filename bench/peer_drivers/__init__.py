"""Drivers for the peer queues of `bench/peers.py`, run by the peers' own virtualenv.

Standard library only here and in `common`: these modules run under another
interpreter (the peers' virtualenv, never taskward's), which has no taskward
dependencies installed.
"""
