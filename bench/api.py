"""`python -m bench api`: the conformance table. Every endpoint the router serves, called with
the official `openai` client (sync and async; its generic post/get for vLLM's own paths) and
with `curl -F` for the uploads, streamed and not where the endpoint streams, through one router
and through three router replicas on one Redis, in front of simulators with the Responses
store on. On three routers every call goes to the next replica, so a conversation's create,
follow-up, retrieve and cancel each pass through another router than the step before.

A cell passes when every check of its calls holds; the JSON keeps each cell's outcome and what
it checked, the table is written beside it."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from .harness.fleet import Fleet
from .provenance import now_utc, stamp

MODEL = "api-model"
SIMS = 3
OUT = Path("bench/results/api")
PROMPT = "The router sends each request to the engine that holds its prefix. " * 8
DOCS = ["a prefix cache", "a load balancer", "a tokenizer", "an audio clip"]
AUDIO = bytes(range(256)) * 250  # 64,000 bytes: two seconds at the simulator's 16 kHz


class Fail(Exception):
    pass


def check(ok: object, why: str) -> None:
    if not ok:
        raise Fail(why)


@dataclass
class Via:
    """One kind of client over one topology. `pick()` gives the next router's client in turn."""

    kind: str  # "sync", "async" (openai clients) or "curl"
    urls: list[str]
    clients: list[Any] = field(default_factory=list)
    turn: int = 0

    def __post_init__(self) -> None:
        make = openai.OpenAI if self.kind == "sync" else openai.AsyncOpenAI
        if self.kind != "curl":
            self.clients = [make(base_url=f"{u}/v1", api_key="none", max_retries=0,
                                 timeout=60.0) for u in self.urls]  # fmt: skip

    def pick(self) -> tuple[Any, str]:
        i = self.turn % len(self.urls)
        self.turn += 1
        return (self.clients[i] if self.clients else None), self.urls[i]

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """fn(client) on the next router: run in a thread (sync) or awaited (async)."""
        client, _ = self.pick()
        if self.kind == "sync":
            return await asyncio.to_thread(fn, client)
        return await fn(client)

    async def events(self, fn: Callable[[Any], Any], upto: Callable[[Any], bool] | None = None,
                     then: Callable[[Any, Any], Any] | None = None) -> tuple[list[Any], Any]:
        """The events of the stream fn(client) opens on the next router, all of them (or up to
        the first that is `upto`; then `then(event, next router's client)` runs while the
        stream is still open and the rest of it is read after): (events, then's result)."""
        client, _ = self.pick()
        other, _ = self.pick() if then is not None else (None, "")
        if self.kind == "sync":
            def run() -> tuple[list[Any], Any]:
                out, got = [], None
                for e in fn(client):
                    out.append(e)
                    if then is not None and got is None and upto is not None and upto(e):
                        got = then(e, other) or True
                return out, got
            return await asyncio.to_thread(run)
        out, got = [], None
        async for e in await fn(client):
            out.append(e)
            if then is not None and got is None and upto is not None and upto(e):
                got = await then(e, other) or True
        return out, got

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        """vLLM's own paths, through the client's generic post (an absolute URL: some are
        not under /v1)."""
        return await self.call(lambda c: c.post(_root(c) + path, body=body, cast_to=object))

    async def get(self, path: str) -> Any:
        return await self.call(lambda c: c.get(_root(c) + path, cast_to=object))

    async def close(self) -> None:
        for c in self.clients:
            r = c.close()
            if self.kind == "async":
                await r


def _root(client: Any) -> str:
    return str(client.base_url).rstrip("/").removesuffix("/v1")


# --- the checks: each returns what it checked, or raises Fail ----------------------------------


async def completions(v: Via, stream: bool) -> str:
    if stream:
        ev, _ = await v.events(lambda c: c.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=8, stream=True))
        text = "".join(e.choices[0].text for e in ev if e.choices)
        check(any(e.choices and e.choices[0].finish_reason for e in ev), "no finish_reason")
    else:
        r = await v.call(lambda c: c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8))
        text = r.choices[0].text
        check(r.usage and r.usage.completion_tokens == 8, f"usage {r.usage}")
    check(text, "no text")
    return "text answered"


async def chat(v: Via, stream: bool) -> str:
    msgs = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hello"}]
    if stream:
        ev, _ = await v.events(lambda c: c.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=8, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(e.choices[0].delta.content or "" for e in ev if e.choices)
        check(ev[-1].usage and ev[-1].usage.completion_tokens == 8, "no usage at the end")
    else:
        r = await v.call(lambda c: c.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=8))
        text = r.choices[0].message.content
    check(text, "no content")
    return "content answered"


def _final(ev: list[Any]) -> Any:
    done = [e.response for e in ev if e.type in ("response.completed", "response.incomplete")]
    check(done, f"no final event in {[e.type for e in ev][:12]}")
    return done[-1]


async def responses(v: Via, stream: bool) -> str:
    """create, then a follow-up by previous_response_id, then both retrieved by id."""
    ids = []
    previous = None
    for turn in range(3):
        # instructions on every turn: a stored response's do not carry over
        args: dict[str, Any] = {"model": MODEL, "input": f"turn {turn}", "instructions": PROMPT,
                                "max_output_tokens": 6}  # fmt: skip
        if previous is not None:
            args["previous_response_id"] = previous
        if stream:
            ev, _ = await v.events(lambda c, a=args: c.responses.create(**a, stream=True))
            r = _final(ev)
            check("".join(e.delta for e in ev if e.type == "response.output_text.delta"),
                  "no text deltas")
        else:
            r = await v.call(lambda c, a=args: c.responses.create(**a))
        check(r.output_text, f"no output_text on turn {turn}")
        if previous is not None:
            check(r.previous_response_id == previous, "previous_response_id not echoed")
        previous = r.id
        ids.append(r.id)
    for rid in ids:
        got = await v.call(lambda c, i=rid: c.responses.retrieve(i))
        check(got.id == rid and got.output_text, f"retrieve {rid}: {got.id}")
    return "3 turns chained by previous_response_id, each retrieved by id"


async def retrieve(v: Via, stream: bool) -> str:
    """A stored response read back by id (streamed: a background streamed response's events
    replayed by GET ?stream=true while it still runs)."""
    if not stream:
        r = await v.call(lambda c: c.responses.create(model=MODEL, input="hi",
                                                      max_output_tokens=4))  # fmt: skip
        got = await v.call(lambda c: c.responses.retrieve(r.id))
        check(got.id == r.id and got.output_text == r.output_text, "not the stored response")
        unknown = "resp_nobody_stored_this"
        try:
            await v.call(lambda c: c.responses.retrieve(unknown))
            raise Fail("an unknown id was found")
        except openai.NotFoundError:
            pass
        return "retrieved by id; an unknown id is a 404"

    def replay(first: Any, c: Any) -> Any:
        rid = first.response.id
        if v.kind == "sync":
            return [e.type for e in c.responses.retrieve(rid, stream=True, starting_after=0)]

        async def go() -> list[str]:
            return [e.type async for e in await c.responses.retrieve(
                rid, stream=True, starting_after=0)]
        return go()

    ev, replayed = await v.events(
        lambda c: c.responses.create(model=MODEL, input="go", background=True, stream=True,
                                     max_output_tokens=40),
        upto=lambda e: e.type == "response.created", then=replay)
    check(replayed and replayed[-1] in ("response.completed", "response.incomplete"),
          f"replay ended {replayed[-3:] if replayed else replayed}")
    _final(ev)
    return "background stream replayed by id through another router while it ran"


async def cancel(v: Via, stream: bool) -> str:
    """A background response cancelled by id through another router while it runs."""
    if not stream:
        r = await v.call(lambda c: c.responses.create(model=MODEL, input="go", background=True,
                                                      max_output_tokens=5000))  # fmt: skip
        check(r.status in ("queued", "in_progress"), f"status {r.status}")
        got = await v.call(lambda c: c.responses.cancel(r.id))
        check(got.status == "cancelled", f"cancel answered {got.status}")
        again = await v.call(lambda c: c.responses.retrieve(r.id))
        check(again.status == "cancelled", f"retrieved {again.status}")
        return "background response cancelled, then retrieved cancelled"

    def stop(first: Any, c: Any) -> Any:
        return c.responses.cancel(first.response.id)

    ev, got = await v.events(
        lambda c: c.responses.create(model=MODEL, input="go", background=True, stream=True,
                                     max_output_tokens=5000),
        upto=lambda e: e.type == "response.created", then=stop)
    check(getattr(got, "status", None) == "cancelled", f"cancel answered {got}")
    check(len(ev) < 5000, "the stream ran to its end")
    return "background stream cancelled by id through another router while it streamed"


async def embeddings(v: Via, stream: bool) -> str:
    r = await v.call(lambda c: c.embeddings.create(model=MODEL, input=["one", "two"],
                                                   encoding_format="float"))  # fmt: skip
    check(len(r.data) == 2 and len(r.data[0].embedding) > 0, "not two vectors")
    return f"2 vectors of {len(r.data[0].embedding)}"


def _rerank(path: str) -> Callable[[Via, bool], Awaitable[str]]:
    async def run(v: Via, stream: bool) -> str:
        r = await v.post(path, {"model": MODEL, "query": "cache", "documents": DOCS})
        check(len(r["results"]) == len(DOCS), f"results {r}")
        return f"{len(DOCS)} documents ranked"
    return run


def _score(path: str) -> Callable[[Via, bool], Awaitable[str]]:
    async def run(v: Via, stream: bool) -> str:
        r = await v.post(path, {"model": MODEL, "text_1": "cache", "text_2": DOCS})
        check(len(r["data"]) == len(DOCS), f"data {r}")
        return f"{len(DOCS)} pairs scored"
    return run


async def pooling(v: Via, stream: bool) -> str:
    r = await v.post("/pooling", {"model": MODEL, "input": ["one", "two"]})
    check(len(r["data"]) == 2, f"data {r}")
    return "2 pooled outputs"


async def classify(v: Via, stream: bool) -> str:
    r = await v.post("/classify", {"model": MODEL, "input": "one"})
    check(len(r["data"]) == 1 and r["data"][0]["probs"], f"data {r}")
    return "1 classified"


async def tokenize(v: Via, stream: bool) -> str:
    r = await v.post("/tokenize", {"model": MODEL, "prompt": "hello world"})
    check(r["tokens"] and r["count"] == len(r["tokens"]), f"tokens {r}")
    return f"{r['count']} tokens"


async def detokenize(v: Via, stream: bool) -> str:
    tok = await v.post("/tokenize", {"model": MODEL, "prompt": "hello world"})
    r = await v.post("/detokenize", {"model": MODEL, "tokens": tok["tokens"]})
    check(r["prompt"].strip() == "hello world", f"prompt {r}")
    return "tokenize -> detokenize round trip"


def _audio(kind: str) -> Callable[[Via, bool], Awaitable[str]]:
    async def run(v: Via, stream: bool) -> str:
        if v.kind == "curl":
            return await _curl(v, kind, stream)
        api = (lambda c: c.audio.transcriptions) if kind == "transcriptions" else (
            lambda c: c.audio.translations)
        upload = ("clip.wav", AUDIO, "audio/wav")
        if stream:
            ev, _ = await v.events(lambda c: api(c).create(model=MODEL, file=upload,
                                                            stream=True))  # fmt: skip
            check(len(ev) >= 3, f"{len(ev)} events")
            return f"{len(ev)} events"
        r = await v.call(lambda c: api(c).create(model=MODEL, file=upload))
        check(r.text and len(r.text.split()) >= 3, f"text {r.text!r}")
        return "text of the clip"
    return run


async def _curl(v: Via, kind: str, stream: bool) -> str:
    _, url = v.pick()
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        f.write(AUDIO)
        f.flush()
        args = ["curl", "-sS", "--fail-with-body", "-F", f"model={MODEL}",
                "-F", f"file=@{f.name};type=audio/wav"]
        if stream:
            args += ["-F", "stream=true"]
        proc = await asyncio.create_subprocess_exec(
            *args, f"{url}/v1/audio/{kind}", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
    check(proc.returncode == 0, f"curl exited {proc.returncode}: {err[:200]!r} {out[:200]!r}")
    if stream:
        lines = [x for x in out.decode().splitlines() if x.startswith("data:")]
        check(lines and lines[-1].strip() == "data: [DONE]", f"stream {out[-200:]!r}")
        return f"{len(lines)} SSE data lines, ending [DONE]"
    check(json.loads(out)["text"], f"answer {out[:200]!r}")
    return "text of the clip"


async def version(v: Via, stream: bool) -> str:
    r = await v.get("/version")
    check(r.get("version"), f"{r}")
    return f"version {r['version']}"


async def models(v: Via, stream: bool) -> str:
    r = await v.call(lambda c: c.models.list())
    ids = [m.id for m in (r.data if hasattr(r, "data") else r)]
    check(MODEL in ids, f"models {ids}")
    return "the model listed"


OPENAI = ("sync", "async")
CURL = ("sync", "async", "curl")


@dataclass(frozen=True)
class Row:
    endpoint: str
    run: Callable[[Via, bool], Awaitable[str]]
    streams: bool = False
    clients: tuple[str, ...] = OPENAI
    stream_clients: tuple[str, ...] | None = None  # streamed cells' clients, when others
    note: str = ""


ROWS: tuple[Row, ...] = (
    Row("POST /v1/completions", completions, streams=True),
    Row("POST /v1/chat/completions", chat, streams=True),
    Row("POST /v1/responses (+ previous_response_id, retrieve)", responses, streams=True),
    Row("GET /v1/responses/{id}", retrieve, streams=True),
    Row("POST /v1/responses/{id}/cancel", cancel, streams=True),
    Row("POST /v1/embeddings", embeddings),
    *(Row(f"POST {p}", _rerank(p)) for p in ("/v1/rerank", "/rerank", "/v2/rerank")),
    *(Row(f"POST {p}", _score(p)) for p in ("/v1/score", "/score")),
    Row("POST /pooling", pooling),
    Row("POST /classify", classify),
    Row("POST /tokenize", tokenize),
    Row("POST /detokenize", detokenize),
    Row("POST /v1/audio/transcriptions", _audio("transcriptions"), streams=True, clients=CURL),
    # the openai client has no streamed translations: curl sends the form field
    Row("POST /v1/audio/translations", _audio("translations"), streams=True, clients=CURL,
        stream_clients=("curl",), note="streamed: curl only (the openai client cannot ask)"),
    Row("GET /version", version),
    Row("GET /v1/models", models),
)
TOPOLOGIES = ("1 router", "3 routers, Redis")


async def run_cells(topologies: dict[str, list[str]]) -> list[dict[str, Any]]:
    cells = []
    for topo, urls in topologies.items():
        for row in ROWS:
            for stream in (False, True) if row.streams else (False,):
                kinds = (row.stream_clients or row.clients) if stream else row.clients
                for kind in kinds:
                    v = Via(kind, urls)
                    t0 = time.perf_counter()
                    try:
                        detail, ok = await asyncio.wait_for(row.run(v, stream), 120), True
                    except Exception as exc:  # a cell's failure is its result
                        detail, ok = f"{type(exc).__name__}: {exc}"[:400], False
                    finally:
                        await v.close()
                    cells.append({"endpoint": row.endpoint, "streamed": stream,
                                  "topology": topo, "client": kind, "ok": ok, "detail": detail,
                                  "seconds": round(time.perf_counter() - t0, 3)})
                    print(f"{'PASS' if ok else 'FAIL'} {topo:17} {kind:5} "
                          f"{'stream' if stream else '      '} {row.endpoint}: {detail}",
                          flush=True)
    return cells


def table(cells: list[dict[str, Any]]) -> list[str]:
    """Rows: endpoint x (streamed, not); columns: the topologies, each cell the clients."""
    head = ["endpoint", "streamed", *TOPOLOGIES]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    seen: dict[tuple[str, bool], dict[str, list[dict[str, Any]]]] = {}
    for c in cells:
        seen.setdefault((c["endpoint"], c["streamed"]), {}).setdefault(c["topology"], []).append(c)
    for (endpoint, stream), got in seen.items():
        marks = []
        for topo in TOPOLOGIES:
            cs = got.get(topo, [])
            bad = [c["client"] for c in cs if not c["ok"]]
            marks.append(f"**FAIL**: {', '.join(bad)}" if bad else
                         "pass: " + ", ".join(c["client"] for c in cs))
        out.append(f"| {endpoint} | {'yes' if stream else 'no'} | " + " | ".join(marks) + " |")
    return out


async def measure() -> dict[str, Any]:
    if shutil.which("curl") is None:
        raise SystemExit("curl is not installed")
    with tempfile.TemporaryDirectory(prefix="bench-api-") as logs:
        async with Fleet(Path(logs)) as fleet:
            sims = [(await fleet.start_sim(
                f"sim{i}", model=MODEL, kv_capacity=200_000, profile="fast", time_scale=1.0,
                extra=["--enable-responses-api-store", "--tokenizer", "tiny"])).url
            for i in range(SIMS)]
            redis = await fleet.start_redis()
            one = await fleet.start_router("router-local", sims, policy="prefix",
                                           kv_capacity=200_000)
            three = [(await fleet.start_router(
                f"router{i}", sims, policy="prefix", kv_capacity=200_000,
                extra=["--store", "redis", "--redis-url", redis])).url for i in range(3)]
            cells = await run_cells({TOPOLOGIES[0]: [one.url], TOPOLOGIES[1]: three})
    return {"cells": cells, "simulators": SIMS, "model": MODEL}


def write(result: dict[str, Any], out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "conformance.json").write_text(json.dumps(result, indent=2) + "\n")
    cells = result["cells"]
    failed = [c for c in cells if not c["ok"]]
    lines = [
        f"`openai` {result['openai']} (sync `OpenAI`, async `AsyncOpenAI`; vLLM's own paths "
        "through its generic `post`/`get`), `curl -F` for the uploads; "
        f"{result['simulators']} simulators with the Responses store on; {result['date']}, "
        f"{result['machine']}, commit {result['version']}; `{result['command']}`.",
        "",
        *table(cells),
        "",
        f"{len(cells) - len(failed)} of {len(cells)} cells pass (a cell: one endpoint, streamed "
        "or not, through one topology with one client). The openai client has no streamed "
        "translations: curl asks for one.",
    ]
    (out / "conformance.md").write_text("\n".join(lines) + "\n")
    return lines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("api", help="conformance: every endpoint with the openai client, "
                       "one router and three on Redis")  # fmt: skip
    p.add_argument("--json", help="also write the JSON here")
    p.add_argument("--out", default=str(OUT), help="results folder")
    p.add_argument("--report", action="store_true", help="only rebuild the table from its JSON")


def main(args: argparse.Namespace, command: str) -> None:
    if args.report:
        print("\n".join(write(json.loads((Path(args.out) / "conformance.json").read_text()),
                               Path(args.out))))
        return
    result = {**stamp(command), "date": now_utc(), "openai": openai.__version__,
              **asyncio.run(measure())}
    lines = write(result, Path(args.out))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines))
    if not all(c["ok"] for c in result["cells"]):
        raise SystemExit(1)
