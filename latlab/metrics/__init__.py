"""The metrics of the contract (docs/design.md), as the catalog (`records.catalog`) defines
them: per-request metrics (`request`), percentiles with confidence intervals (`stats`), rates
over the window (`throughput`), SLOs (`slo`), the client self-check (`client`) and the run
summary that gathers them (`summary`). All latencies in ms."""
