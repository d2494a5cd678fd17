"""Models: decoders written only with the portable layers, and the shipped tiny-granite checkpoint."""
