"""One renderer for every error the client can see, always in OpenAI's shape."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from gateway.errors import GatewayError, InvalidRequest, MethodNotAllowed, NotFound

log = logging.getLogger("gateway.api")


def error_response(error: GatewayError) -> Response:
    return Response(
        orjson.dumps(error.body()),
        status_code=error.http_status,
        media_type="application/json",
        headers=error.response_headers(),
    )


def install_error_handlers(app: FastAPI) -> None:
    async def gateway_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return error_response(NotFound(f"no such endpoint: {request.method} {request.url.path}"))
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            return error_response(MethodNotAllowed(request.method, request.url.path, allowed))
        return error_response(InvalidRequest(str(exc.detail)))

    async def validation_error(_: Request, exc: Exception) -> Response:
        return error_response(InvalidRequest(f"invalid request: {exc}"))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s (%s)", request.method, request.url.path,
                      getattr(request.state, "request_id", "no request id"))
        error = GatewayError("the gateway hit an internal error; it has been logged")
        return error_response(error)

    app.add_exception_handler(GatewayError, gateway_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
