"""`POST /v1/responses` served as a chat completion through the one runner - so
admission, budgets and holds, the response cache, routes with escalation, retries,
failover and the ledger apply exactly as on `/v1/chat/completions` - with the
conversation a `previous_response_id` names read from, and the new turn written to,
the tenant's response store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.accounting.responses_store import ResponseStore, StoredResponse, encoded_size
from gateway.errors import InvalidRequest, NotFound
from gateway.pipeline.parse import parse_json_object
from gateway.pipeline.responses_stream import ResponseStreamTranslator, translated
from gateway.pipeline.responses_translate import chat_body, check_request, from_chat_completion, input_items, new_id
from gateway.pipeline.runner import JsonReply, Pipeline, StreamReply

CHAT = "chat.completions"


class ResponsesService:
    def __init__(self, pipeline: Pipeline, store: ResponseStore) -> None:
        self.pipeline = pipeline
        self.store = store

    async def create(self, raw: bytes, headers: Mapping[str, str]) -> JsonReply | StreamReply:
        body = parse_json_object(raw)
        check_request(body)
        policy = self.pipeline.policies.current
        # The tenant first: the conversation to continue is looked up in its store only.
        tenant = self.pipeline.identify(headers, policy).tenant
        history = await self.history(tenant, body.get("previous_response_id"))
        items = with_ids(input_items(body))
        keep = body.get("store", True)
        defaults = policy.policy.defaults
        if keep and encoded_size(history, items, {}) > defaults.stored_response_max_bytes:
            raise InvalidRequest(f"the conversation is over the {defaults.stored_response_max_bytes} bytes a stored response may "
                                 "hold; start a new one, or send `store: false`", param="input")
        chat = chat_body(body, [*history, *items])
        response_id = new_id("resp")

        async def store(response: dict[str, Any]) -> None:
            if keep:
                await self.store.save(tenant, StoredResponse(response_id, tenant, history, items, response),
                                      defaults.stored_responses_ttl_s)

        reply = await self.pipeline.run(CHAT, orjson.dumps(chat), headers)
        if isinstance(reply, StreamReply):
            translator = ResponseStreamTranslator(response_id, body, body["model"], store)
            return StreamReply(translated(reply.chunks, translator), reply.headers)
        response = from_chat_completion(response_id, body, orjson.loads(reply.body), body["model"])
        await store(response)
        return JsonReply(200, orjson.dumps(response), reply.headers)

    async def history(self, tenant: str, previous_id: str | None) -> list[dict[str, Any]]:
        if not previous_id:
            return []
        previous = await self.store.get(tenant, previous_id)
        if previous is None:
            raise not_found(previous_id, param="previous_response_id")
        return previous.conversation()


def not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param=param)


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as `input_items` lists them: each with an id of its own."""
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
    return [item if item.get("id") else {"id": new_id(prefixes[item["type"]]), **item} for item in items]
