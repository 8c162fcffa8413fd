"""SQL persistence: schema, migrations, event store, projections, inputs, claims, queries.

The store never imports Temporal. ``open_store`` is the one entry point.
"""

from store.facade import Store, open_store

__all__ = ["Store", "open_store"]
