"""Where servable definitions live (stores) and where artifacts come from (fetchers)."""
