"""The server side of HTTP/1.1: the connection protocol uvicorn runs for the gateway."""
