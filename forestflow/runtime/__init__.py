"""Servables, flavors and the scheduler that runs them."""
