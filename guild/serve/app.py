"""The HTTP side of `guild serve`: OpenAI's /v1/chat/completions, /v1/completions and /v1/models, /health and
/metrics, on Starlette. Requests are validated (schema.py), tokenised and checked against the context here, then
handed to the engine thread; tokens come back through an asyncio queue, streamed as server-sent events."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from dataclasses import replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import GuildError
from ..text import tools as toolcalls
from ..text.grammar import GrammarError, compile_grammar, constraint
from .batcher import BatchEngine, DrainingError, Job, QueueFullError, Result
from .schema import MAX_BODY_BYTES, CompletionRequest, Defaults, RequestError, parse


def error(e: RequestError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


class Server:
    """The app's state: the loaded model's engine, the request defaults, the model's name."""

    def __init__(self, engine: BatchEngine, model_name: str, defaults: Defaults):
        self.engine, self.name, self.defaults = engine, model_name, defaults
        self.created = int(time.time())
        self.tok = engine.tok
        self.ready = False  # set once the warm-up request (guild.serve.warm_up) is answered

    def app(self) -> Starlette:
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
        ]
        app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})
        app.add_middleware(_Count, metrics=self.engine.metrics)
        return app

    async def _http_error(self, request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        # a 405 names the methods the route takes (Allow), as HTTP asks
        return error(RequestError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code,
                                  kind=kind), headers=exc.headers)

    # -- small endpoints ----------------------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": self.created, "owned_by": "guild"}]})

    async def health(self, request: Request) -> Response:
        e = self.engine
        if not self.ready:  # llama.cpp's server answers 503 while it loads
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "active": e.active, "waiting": e.waiting})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.engine.metrics.render(), media_type="text/plain; version=0.0.4")

    # -- completions --------------------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool) -> Response:
        try:
            req = parse(await _body(request), chat, self.defaults)
            # a long prompt or a large grammar must not stall other streams
            ids, matcher = await asyncio.to_thread(self._tokens, req)
        except RequestError as e:
            return error(e)
        except ClientDisconnect:
            return Response(status_code=499)
        sampling = req.sampling
        if not req.seeded and not sampling.greedy:
            sampling = replace(sampling, seed=secrets.randbits(63))  # OpenAI: no seed, a fresh draw each request
        room = self.engine.context - len(ids)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def emit(kind, payload):  # called on the engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))
            except RuntimeError:  # the event loop is gone (shutdown past --drain-timeout): nobody is listening
                job.cancelled = True

        job = Job(ids, min(req.max_tokens or room, room), sampling, req.strategy, req.max_draft, req.stop, emit,
                  logprobs=req.logprobs, constraint=matcher)
        try:
            self.engine.submit(job)
        except QueueFullError as e:
            return error(RequestError(f"server busy: {e}; retry later", status=429, kind="rate_limit_error",
                                      code="queue_full"), headers={"Retry-After": "1"})
        except DrainingError as e:
            return error(RequestError(str(e), status=503, kind="server_error"))
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        if req.stream:
            return StreamingResponse(self._events(job, queue, req, rid), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._whole(request, job, queue, req, rid)

    def _tokens(self, req: CompletionRequest):
        """The prompt's ids and the matcher of the grammar the reply follows (or None)."""
        offered = list(req.tools) if req.tool_choice != "none" else []
        try:
            if not req.chat:
                text = req.prompt
            elif offered or any(m["role"] == "tool" or m.get("tool_calls") for m in req.messages):
                text = toolcalls.render(self.tok, list(req.messages), offered)
            else:
                text = self.tok.apply_chat_template(list(req.messages), add_generation_prompt=True)
            ids = self.tok.encode(text, add_special=True)
        except GuildError as e:
            raise RequestError(str(e), "messages" if req.chat else "prompt") from None
        grammar = None
        try:
            for i, t in enumerate(offered):  # every offered schema must compile, called or not
                compile_grammar("json_schema", t["function"]["parameters"], self.tok,
                                f"tools[{i}].function.parameters")
            if req.grammar is not None:
                if req.tool_choice == "required" or req.named:
                    raise RequestError(f"'{req.grammar[2]}' and a required tool call cannot both constrain one "
                                       "reply", req.grammar[2])
                kind, spec, where = req.grammar
                grammar = compile_grammar(kind, spec, self.tok, where)
            elif req.tool_choice == "required" or req.named:
                grammar = toolcalls.grammar(self.tok, offered, req.tool_choice if req.named else None)
        except GrammarError as e:
            raise RequestError(str(e), e.where) from None
        n_ctx = self.engine.context
        if len(ids) + 1 > n_ctx:
            raise RequestError(f"the prompt is {len(ids)} tokens and the context is {n_ctx} tokens (at least one "
                               "generated token must fit)", "messages" if req.chat else "prompt",
                               code="context_length_exceeded")
        try:
            return ids, None if grammar is None else constraint(grammar, self.tok)
        except GrammarError as e:
            raise RequestError(str(e), e.where) from None

    async def _whole(self, request: Request, job: Job, queue: asyncio.Queue, req: CompletionRequest,
                     rid: str) -> Response:
        parts = []
        while True:
            try:
                kind, payload = await asyncio.wait_for(queue.get(), 0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancelled = True
                    return Response(status_code=499)
                continue
            if kind == "text":
                parts.append(payload)
            elif kind == "error":
                return error(RequestError(payload, status=500, kind="server_error"))
            elif kind == "done":
                return JSONResponse(self._body(payload, req, rid))

    async def _events(self, job: Job, queue: asyncio.Queue, req: CompletionRequest, rid: str):
        """Server-sent events: OpenAI's chunk objects, then `data: [DONE]`. A client that goes away cancels the
        job (Starlette cancels this generator), and its rows leave the batch before the next round."""
        offset = [0]  # /v1/completions' text_offset runs on across chunks
        calls = toolcalls.CallStream(self.tok, self._names(req)) if self._calls_on(req) else None
        try:
            if req.chat:
                yield _sse(self._chunk(rid, req, {"role": "assistant", "content": ""}, None))
            while True:
                kind, payload = await queue.get()
                if kind == "text":
                    text, deltas = (payload, []) if calls is None else calls.push(payload)
                    if text:
                        yield _sse(self._chunk(rid, req, {"content": text} if req.chat else text, None))
                    for d in deltas:
                        tc = {"index": d.index, **_call(d.call)} if d.call else \
                            {"index": d.index, "function": {"arguments": d.arguments}}
                        yield _sse(self._chunk(rid, req, {"tool_calls": [tc]}, None))
                elif kind == "logprobs":
                    lp = self._logprobs(payload, req, offset)
                    if lp is not None:
                        c = self._chunk(rid, req, {} if req.chat else "", None)
                        c["choices"][0]["logprobs"] = lp
                        yield _sse(c)
                elif kind == "error":
                    yield _sse({"error": {"message": payload, "type": "server_error", "param": None, "code": None}})
                    break
                else:
                    res: Result = payload
                    finish = res.finish_reason
                    if calls is not None:
                        rest, found, is_calls = calls.finish(self.tok)
                        if rest:
                            yield _sse(self._chunk(rid, req, {"content": rest}, None))
                        for i, c in enumerate(found, len(calls.streamed)):
                            yield _sse(self._chunk(rid, req, {"tool_calls": [{"index": i, **_call(c)}]}, None))
                        finish = "tool_calls" if is_calls else finish
                    last = self._chunk(rid, req, {} if req.chat else "", finish)
                    if req.return_tokens:
                        last["guild"] = self._extra(res)
                    yield _sse(last)
                    if req.include_usage:
                        yield _sse({**self._chunk(rid, req, None, None), "choices": [], "usage": _usage(res)})
                    break
            yield "data: [DONE]\n\n"
        finally:
            job.cancelled = True  # no-op once finished; stops a job whose client went away

    def _chunk(self, rid: str, req: CompletionRequest, delta, finish) -> dict:
        if req.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.name,
                    "system_fingerprint": None, "choices": [choice]}
        choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.name,
                "choices": [choice]}

    def _logprobs(self, lps, req: CompletionRequest, offset: list[int]) -> dict | None:
        """OpenAI's logprobs object for these tokens (end-of-generation tokens, which have no text, left out):
        chat's `content` list, or the completions API's parallel lists."""
        lps = [x for x in lps if x.token not in self.tok.eos_ids]
        if req.logprobs is None or not lps:
            return None

        def piece(t):
            b = self.tok.token_bytes(t)
            return b.decode("utf-8", errors="replace"), list(b)

        if req.chat:
            content = []
            for x in lps:
                text, raw = piece(x.token)
                top = [{"token": piece(t)[0], "logprob": v, "bytes": piece(t)[1]} for t, v in x.top]
                content.append({"token": text, "logprob": x.logprob, "bytes": raw, "top_logprobs": top})
            return {"content": content}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for x in lps:
            text = piece(x.token)[0]
            out["tokens"].append(text)
            out["token_logprobs"].append(x.logprob)
            out["top_logprobs"].append({piece(t)[0]: v for t, v in x.top})
            out["text_offset"].append(offset[0])
            offset[0] += len(text)
        return out

    def _body(self, res: Result, req: CompletionRequest, rid: str) -> dict:
        lp = self._logprobs(res.logprobs, req, [0])
        if req.chat:
            content, found = toolcalls.parse(res.text, self.tok, self._names(req)) if self._calls_on(req) \
                else (res.text, [])
            message = {"role": "assistant", "content": content or (None if found else "")}
            if found:
                message["tool_calls"] = [_call(c) for c in found]
            choice = {"index": 0, "message": message, "logprobs": lp,
                      "finish_reason": "tool_calls" if found else res.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": res.text, "logprobs": lp, "finish_reason": res.finish_reason}
            obj = "text_completion"
        body = {"id": rid, "object": obj, "created": int(time.time()), "model": self.name, "choices": [choice],
                "usage": _usage(res)}
        if req.return_tokens:
            body["guild"] = self._extra(res)
        return body

    @staticmethod
    def _calls_on(req: CompletionRequest) -> bool:
        """Whether the reply is read for tool calls (tools offered and a grammar of the caller's not in force)."""
        return req.chat and bool(req.tools) and req.tool_choice != "none" and req.grammar is None

    @staticmethod
    def _names(req: CompletionRequest) -> set[str]:
        names = {t["function"]["name"] for t in req.tools}
        return {req.tool_choice} if req.named else names

    @staticmethod
    def _extra(res: Result) -> dict:
        """guild's extension (with "return_tokens": true): the token ids and how they were decoded."""
        st = res.stats
        s = st.summary()
        return {"tokens": res.tokens, "reused_prompt_tokens": res.reused_tokens,
                "ttft_ms": round(res.ttft_s * 1e3, 2), "decode_tok_s": round(st.decode_tok_s, 2),
                "stop_reason": st.stop_reason, "windows": s["windows"], "drafted": s["drafted"],
                "accepted": s["accepted"], "strategies": s["strategies"]}


def _call(c: toolcalls.ToolCall) -> dict:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def _usage(res: Result) -> dict:
    n = len(res.tokens)
    return {"prompt_tokens": res.prompt_tokens, "completion_tokens": n, "total_tokens": res.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": res.reused_tokens}}


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _body(request: Request) -> bytes:
    """The body, refused past MAX_BODY_BYTES without reading it all."""
    n = request.headers.get("content-length")
    if n is not None and (not n.isdigit() or int(n) > MAX_BODY_BYTES):
        raise RequestError(f"request body of {n} bytes is over the limit of {MAX_BODY_BYTES}", status=413)
    chunks, size = [], 0
    async for c in request.stream():
        size += len(c)
        if size > MAX_BODY_BYTES:
            raise RequestError(f"request body is over the limit of {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(c)
    return b"".join(chunks)


class _Count:
    """Counts answered requests by endpoint and status (guild_requests_total)."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {}

        async def send_(msg):
            if msg["type"] == "http.response.start":
                status["code"] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, send_)
        finally:
            self.metrics.inc("guild_requests_total", endpoint=scope["path"][:64] if scope["path"] in _PATHS
                             else "other", status=str(status.get("code", 499)))


_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
