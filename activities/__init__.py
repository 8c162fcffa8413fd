"""Every side effect but SQL: provider turns, tools, and the claim and recovery glue."""
