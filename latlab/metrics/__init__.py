"""The metrics of the contract (DESIGN.md, docs/design.md): each formula stated once
(`formulas`), per-request metrics (`request`), percentiles with confidence intervals
(`stats`), rates over the window (`throughput`), SLOs (`slo`), the client self-check
(`client`) and the run summary that gathers them (`summary`). All latencies in ms."""
