"""Explaining latency: per-request decomposition, aggregate budgets, diagnosis."""

from latlab.analysis.analyze import RunAnalysis, analyze

__all__ = ["RunAnalysis", "analyze"]
