"""Spend and budgets (``sessionflow/models/spend.py``): what a total says, when a limit is
reached, and what a person reads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sessionflow.models.common import CacheTokens, Tokens
from sessionflow.models.spend import Budget, Spend


def test_a_total_of_unpriced_steps_is_unknown_not_zero() -> None:
    unknown = Spend(tokens=Tokens(input=5), unpriced_steps=2)
    assert unknown.cost is None
    assert unknown.describe() == "cost unknown (2 steps unpriced)"
    priced = Spend(tokens=Tokens(input=5), usd=0.25, priced_steps=1)
    both = unknown + priced
    assert both.cost == pytest.approx(0.25)
    assert both.describe() == "$0.2500 (2 steps unpriced)"
    assert Spend().cost == 0.0  # nothing ran: nothing spent


def test_a_dumped_spend_reads_back() -> None:
    spend = Spend(tokens=Tokens(output=3), usd=0.5, priced_steps=2, unpriced_steps=1)
    dumped = spend.model_dump(mode="json")
    assert dumped["cost"] == 0.5
    assert Spend.model_validate(dumped) == spend


def test_a_budget_is_reached_at_its_limit_and_says_by_how_much() -> None:
    budget = Budget(usd=2.0, tokens=1000)
    assert budget.reached(Spend(usd=1.99, priced_steps=3)) is None
    reached = budget.reached(Spend(usd=2.0134, priced_steps=4))
    assert reached is not None and reached.limit == "usd"
    assert reached.describe() == "budget reached: $2.0134 spent of $2 (+$0.0134)"
    tokens = Tokens(input=600, output=300, reasoning=50, cache=CacheTokens(read=40, write=20))
    by_tokens = budget.reached(Spend(tokens=tokens))
    assert by_tokens is not None and by_tokens.limit == "tokens"
    assert by_tokens.describe() == "budget reached: 1,010 tokens used of 1,000 (+10)"


@pytest.mark.parametrize("bad", [{"usd": 0}, {"usd": -1}, {"tokens": 0}, {"usd": float("inf")}])
def test_a_budget_must_be_positive_and_finite(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Budget.model_validate(bad)
