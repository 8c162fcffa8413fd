"""What a session spends and may spend: prices, totals, budgets (ground: imports nothing of ours
but the common value models).

A step's cost is ``None`` when nobody knows it (a model without a price, a step without
reported usage), never 0: a total says how many of its steps were priced, so "$0.00" is never
shown for a session whose spend is unknown.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, computed_field, field_validator, model_validator

from sessionflow.models.common import CacheTokens, Model, Tokens

MILLION = 1_000_000


class Price(Model):
    """USD per million tokens, as a scripted model declares it (``"price"`` at the top level).
    Reasoning tokens cost the output price unless ``reasoning`` says otherwise."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float = Field(0.0, ge=0)
    cache_write: float = Field(0.0, ge=0)
    reasoning: float | None = Field(None, ge=0)

    @field_validator("input", "output", "cache_read", "cache_write", "reasoning")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("a price must be a finite number of USD per million tokens")
        return value

    def cost(self, tokens: Tokens) -> float:
        """USD for one step's normalized tokens (``input`` excludes cache, ``output`` excludes
        reasoning)."""
        reasoning = self.output if self.reasoning is None else self.reasoning
        total = (
            tokens.input * self.input
            + tokens.output * self.output
            + tokens.reasoning * reasoning
            + tokens.cache.read * self.cache_read
            + tokens.cache.write * self.cache_write
        )
        return total / MILLION


def token_total(tokens: Tokens) -> int:
    """Every token a step was billed for: what a token budget counts."""
    return tokens.input + tokens.output + tokens.reasoning + tokens.cache.read + tokens.cache.write


def add_tokens(a: Tokens, b: Tokens) -> Tokens:
    cache = CacheTokens(read=a.cache.read + b.cache.read, write=a.cache.write + b.cache.write)
    return Tokens(
        input=a.input + b.input,
        output=a.output + b.output,
        reasoning=a.reasoning + b.reasoning,
        cache=cache,
    )


class Spend(Model):
    """A session's (or a tree's) spend: its tokens, the USD of its priced steps, and how many
    steps were priced and not."""

    tokens: Tokens = Tokens()
    usd: float = 0.0
    priced_steps: int = 0
    unpriced_steps: int = 0

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        """A dumped spend reads back: ``cost`` is derived, never stored."""
        if isinstance(data, dict) and "cost" in data:
            data = {k: v for k, v in data.items() if k != "cost"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost(self) -> float | None:
        """USD spent; ``None`` when steps ran and none of them could be priced."""
        if self.unpriced_steps and not self.priced_steps:
            return None
        return self.usd

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            tokens=add_tokens(self.tokens, other.tokens),
            usd=self.usd + other.usd,
            priced_steps=self.priced_steps + other.priced_steps,
            unpriced_steps=self.unpriced_steps + other.unpriced_steps,
        )

    def describe(self) -> str:
        """``$0.0123``, ``$0.0123 (2 steps unpriced)`` or ``cost unknown (3 steps unpriced)``."""
        if self.cost is None:
            return f"cost unknown ({_steps(self.unpriced_steps)} unpriced)"
        text = f"${self.usd:.4f}"
        if self.unpriced_steps:
            text += f" ({_steps(self.unpriced_steps)} unpriced)"
        return text


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


class Budget(Model):
    """Limits on a session's spend; a limit left out does not apply. USD counts priced steps."""

    usd: float | None = Field(None, gt=0)
    tokens: int | None = Field(None, gt=0)

    @field_validator("usd")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("a USD budget must be a finite amount")
        return value

    @property
    def empty(self) -> bool:
        return self.usd is None and self.tokens is None

    def reached(self, spend: Spend) -> BudgetReached | None:
        """The first limit ``spend`` has reached, else None."""
        if self.usd is not None and spend.usd >= self.usd:
            return BudgetReached(limit="usd", allowed=self.usd, spent=spend.usd)
        used = token_total(spend.tokens)
        if self.tokens is not None and used >= self.tokens:
            return BudgetReached(limit="tokens", allowed=self.tokens, spent=used)
        return None

    def describe(self) -> str:
        parts = []
        if self.usd is not None:
            parts.append(f"${self.usd:g}")
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        return " and ".join(parts) if parts else "none"


class BudgetReached(Model):
    """Which limit stopped the session, and by how much."""

    limit: Literal["usd", "tokens"]
    allowed: float
    spent: float

    def describe(self) -> str:
        if self.limit == "usd":
            over = self.spent - self.allowed
            return f"budget reached: ${self.spent:.4f} spent of ${self.allowed:g} (+${over:.4f})"
        over_tokens = int(self.spent - self.allowed)
        return (
            f"budget reached: {int(self.spent):,} tokens used of {int(self.allowed):,} "
            f"(+{over_tokens:,})"
        )
