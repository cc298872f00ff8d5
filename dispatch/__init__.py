"""Shared domain of the dispatcher: job model, events, pure core, settings, stack, CLI."""
