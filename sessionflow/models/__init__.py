"""Pydantic models shared by every layer: events, messages, parts, inputs, errors."""
