"""latlab: measure, explain and predict the end-to-end latency of AI inference services."""

__version__ = "0.1.0"
