"""Model providers: one protocol, normalized stream events, and the adapters."""
