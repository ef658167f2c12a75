"""The node's view of the change feed: which stores it covers, and what a change record marks stale (docs/change-feed.md)."""
