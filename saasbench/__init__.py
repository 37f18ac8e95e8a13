"""saasbench: run the SaaSBench benchmark for real.

The core (DAG model and loader, engine, scoring, reports) imports neither Prefect nor any
network library at module load, so ``saasbench --help`` stays fast and the core is testable
offline.
"""

__version__ = "0.1.0"
