"""Terminal output (rich): the run summary table, the latency budget and the findings."""
