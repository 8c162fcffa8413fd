"""sessionflow: durable execution for AI coding-agent sessions, on Temporal.

This package is both the ground every layer stands on (``models``, ``errors``, ``settings``,
``ids``: pure, importing nothing of ours) and the roof (client, CLI, dev stack). Keep this
module free of roof imports so the store and workflows can import the ground cheaply.
"""

__version__ = "0.1.0"
