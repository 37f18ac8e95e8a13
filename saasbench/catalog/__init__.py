"""Tasks as data: task.yaml, public-task import and fetch, prompt facts, compose specs, image maps, readiness."""
