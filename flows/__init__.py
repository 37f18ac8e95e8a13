"""Prefect flows, one lifecycle stage per module (installed as ``saasbench.flows``).

The flows arrive with the orchestration issue; the core they call lives in ``saasbench``
and runs without Prefect.
"""
