"""One evaluation of a running app: context, engine (gating, chains, deadlines), scoring, report models."""
