"""Inference engines behind one small contract (see `base`), chosen by name."""
