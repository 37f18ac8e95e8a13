"""One trial and one sweep in plain Python: trial phases, sweep plan and retries, model gateway, reference validation."""
