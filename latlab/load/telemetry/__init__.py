"""What the target reports besides its answers: OpenTelemetry spans (received, read, joined
to the requests) and Prometheus /metrics."""
