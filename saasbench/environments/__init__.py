"""Where a trial runs: the Environment interface, the local and Docker backends, exec targets, image cache."""
