"""The target: starting a server, asking it what it is, probing its cold start."""
