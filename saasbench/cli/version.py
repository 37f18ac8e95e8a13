"""``saasbench version``."""

from __future__ import annotations

import typer


def version() -> None:
    """Print the saasbench version.

    Example: saasbench version
    """
    import platform

    from saasbench import __version__

    typer.echo(f"saasbench {__version__} (Python {platform.python_version()})")
