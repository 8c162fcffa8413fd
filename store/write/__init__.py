"""The store's write package: each rule a durable write must keep, defined once.

- ``fence``: the claim's fence (session, execution, owner, epoch, expiry by the database clock
  read after the row lock) and the attempt fences (a step's attempt, a tool call's attempt).
- ``allocation``: seq allocation.
- ``decide``: read with a version, decide, write only if nothing moved, else decide again in a
  fenced transaction; the activities hand it their pure decision functions.
- ``fast``: the writers of the one-statement forms, composed from the clauses above.

The database clock itself is ``store.dialect.now_ms``; nothing else spells it.
"""
