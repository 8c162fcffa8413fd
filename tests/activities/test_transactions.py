"""Catalogue F6's static check: a fenced transaction waits for nothing but itself.

A fenced transaction holds the claim row from its first statement to its commit: a takeover
waits for it (F3), and on PostgreSQL it also holds one of the pool's connections. So the code
that runs inside one (every function of ``activities/`` that is handed the transaction, ``tx``)
may await only work done *on* that transaction: each awaited call is handed ``tx``. Awaiting
anything else there -- a read on a connection of its own, a provider, a tool, a sleep -- holds
the claim while the database's clock runs on, and can wait for a connection that only another
such transaction would give back. The lease bounds how long an idle transaction may stay open
(``store.dialect.Waits``); this check keeps code from coming near that bound.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _hands_tx(call: ast.expr) -> bool:
    if not isinstance(call, ast.Call):
        return False
    arguments = [*call.args, *(keyword.value for keyword in call.keywords)]
    return any(isinstance(n, ast.Name) and n.id == "tx" for a in arguments for n in ast.walk(a))


def _body_nodes(function: ast.AsyncFunctionDef | ast.FunctionDef) -> list[ast.AST]:
    """The function's own nodes: a nested function runs only when something calls it."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def waits_outside_the_transaction(source: str, name: str) -> list[str]:
    """Every await, ``async with`` and ``async for`` in a function of ``source`` that takes
    ``tx`` and is not work on ``tx``, as ``name:line: code``."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        if "tx" not in [a.arg for a in (*function.args.args, *function.args.kwonlyargs)]:
            continue
        for node in _body_nodes(function):
            waits = isinstance(node, ast.AsyncWith | ast.AsyncFor) or (
                isinstance(node, ast.Await) and not _hands_tx(node.value)
            )
            if waits:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_code_inside_a_fenced_transaction_awaits_only_work_on_it() -> None:
    """F6: no function of ``activities/`` that runs in a transaction awaits anything else."""
    modules = sorted((ROOT / "activities").rglob("*.py"))
    assert len(modules) > 20  # the tree was found
    found = [
        wait
        for path in modules
        for wait in waits_outside_the_transaction(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_check_reports_what_waits_inside_a_transaction() -> None:
    """F6, the check's negative control: a read on a connection of its own, a sleep and an
    ``async with`` inside a function handed ``tx`` are reported; work on ``tx`` and nested
    functions are not."""
    source = textwrap.dedent(
        """
        async def settle(self, tx, message):
            events = await closing_events(self.store, message)
            await asyncio.sleep(1)
            async with self.store.db.read() as conn:
                pass
            await self.store.events.publish_many(events, tx=tx)
            await load_message(tx, message.id)

            async def later():
                await asyncio.sleep(1)

        async def outside(store):
            await asyncio.sleep(1)
        """
    )
    assert sorted(waits_outside_the_transaction(source, "example")) == [
        "example:3: await closing_events(self.store, message)",
        "example:4: await asyncio.sleep(1)",
        "example:5: async with self.store.db.read() as conn:",
    ]
