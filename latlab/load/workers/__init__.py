"""Who sends: a worker's schedule loop and request recording, its processes (`--workers`,
`--ray`), its self-check and the live progress line."""
