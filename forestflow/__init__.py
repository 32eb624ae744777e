"""forestflow: an asyncio model-serving gateway in the style of ForestFlow."""

__version__ = "0.1.0"
