"""`latlab predict`'s simulator: a server's replicas scheduled by the engine's own scheduler,
charged by a calibrated step-cost model, behind a simulated router and autoscaler, driven by
bench's workloads — fast enough for a million requests (see `replica` for how)."""
