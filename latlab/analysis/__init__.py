"""Explaining latency: per-request decomposition, aggregate budgets, diagnosis."""

from latlab.analysis.analyze import analyze
from latlab.analysis.run_analysis import RunAnalysis

__all__ = ["RunAnalysis", "analyze"]
