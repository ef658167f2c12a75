"""`secrets-bridge watch`: the change feed's cluster component (docs/change-feed.md)."""
