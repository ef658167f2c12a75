"""The node's side of the change feed: one list+watch of the feed ConfigMaps (docs/change-feed.md)."""
