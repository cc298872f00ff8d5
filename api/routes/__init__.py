"""The REST contract, one router per concern."""
