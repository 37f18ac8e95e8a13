"""Agent adapters behind one interface (installed as ``saasbench.agents``).

The agent interface, the oracle/nop agents and the CLI adapters arrive with the demo and
rollout issues; this package is where they live.
"""
