"""Agent adapters behind one interface (installed as ``saasbench.agents``).

``base`` holds the interface (:class:`Agent`, :class:`Budget`, :class:`Trajectory`), the
registry (:func:`get_agent`, :func:`agent_class`, :func:`list_agents`, :func:`register_agent`) and
the task prompt (:func:`build_prompt`). Built-in agents: ``oracle`` (installs the reference
implementation), ``nop`` (does nothing) and ``builtin`` (a litellm tool-using loop,
:mod:`saasbench.agents.builtin`); :mod:`saasbench.agents.anticheat` scans trajectories for fetched
source code. A CLI adapter (Claude Code, Codex, OpenHands) is one module: its agent class (command
line, install, process environment, ``gateway_env``, the tool names it records: ``shell_tools``,
``file_tools``) and its stream parser (registered with
:func:`saasbench.agents.events.register_parser`); importing the module below registers both.
"""

from saasbench.agents.base import (
    Agent,
    AgentNotFound,
    Budget,
    Trajectory,
    TrajectoryEvent,
    agent_class,
    build_prompt,
    get_agent,
    list_agents,
    register_agent,
    stage_task_inputs,
)

__all__ = [
    "Agent",
    "AgentNotFound",
    "Budget",
    "Trajectory",
    "TrajectoryEvent",
    "agent_class",
    "build_prompt",
    "get_agent",
    "list_agents",
    "register_agent",
    "stage_task_inputs",
]

# Registers the ``builtin`` agent (imported after ``base``; litellm itself is imported lazily on the first model call).
from saasbench.agents import builtin as _builtin  # noqa: F401

# Registers the CLI adapters ``claude-code``, ``codex`` and ``openhands`` and their stream parsers
# (imported after ``base``). A new adapter module is imported here too.
from saasbench.agents import claude_code as _claude_code  # noqa: F401,E402
from saasbench.agents import codex as _codex  # noqa: F401
from saasbench.agents import openhands as _openhands  # noqa: F401
