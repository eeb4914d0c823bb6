"""The diagnosis rules, each named after the symptom an engineer calls it by. A rule is a
function `(RunAnalysis) -> Finding | Unevaluated | None` (see `latlab.analysis.diagnose`);
its thresholds are constants at the top of its module."""
