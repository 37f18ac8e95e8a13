"""Aggregation over the lake (the paper's tables), backbones, the HTML report."""
