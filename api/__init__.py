"""The leader service: FastAPI app serving the REST contract and the WebSocket stream."""
