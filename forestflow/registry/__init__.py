"""The registry: the servables a gateway holds (registry.py), how they are loaded (loader.py), where
their definitions are persisted (stores) and where their artifacts come from (artifact cache)."""
