"""3. Invocation overhead: `ToolSet.invoke` on an echo service vs bare pulsar-client, same broker, same payload.

Ours: the echo service in its own process (`python -m bench.serve`, a
`DynamicToolService`), called through a running `ToolSet`. Reference: a
bare pulsar-client responder in its own process (`bench.raw responder`)
called by bare pulsar-client: the sync API for the sequential round trip
(the floor), pulsar.asyncio for concurrency (what an asyncio agent gets
without us). A second bare responder on pulsar.asyncio gives the floor for
an event-loop service at both ends, which is what the product is. A third
bare responder answers from the client's `message_listener`, called by an
asyncio caller on the client's listener and `send_async` callbacks
(`raw.listener_rtt`): the fastest the bare client allows an event-loop caller,
the reference for calls/s at 64 in flight. A fourth hands each request from
its listener to an event loop that answers (`raw.loop_responder`): called by
the same listener-bridged caller, the least any service whose handlers run on
a loop costs, with no product code. The request bytes are the ones
`ToolServiceClient` sends.

Answer signing: a second echo service (`bench-echo-signed`) signs every
answer with its key, and its config item carries the public key
(`answer-key`), so the bridge checks every answer; its p50 and calls/s at 64
in flight are taken in the same rounds as the unsigned echo's, and the bare
cost of one signature and one check on the answer's bytes beside them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from agent_bridge import ToolSet
from toolservice_base import ConfigClient, Transport, open_transport
from toolservice_base.schemas import ToolServiceRequest
from toolservice_base.signing import (
    answer_checker,
    answer_signer,
    generate_key_pair,
    load_private_key,
    public_key_text,
)

from . import raw
from .b_death import Watch
from .common import (
    Progress,
    Stack,
    Workdirs,
    profiling,
    sampled,
    spawn,
    summary_ms,
    wait_for_line,
)
from .serve import echo_class

NAME = "invoke"
TARGET_RATIO = 1.5
TARGET_RATE_RATIO = 0.6
"""Calls/s at 64 in flight against the listener-bridged bare caller and responder (the goal is 0.8)."""
LOOP_P50_TARGET = 1.3
"""Sequential p50 at most this multiple of the bare loop pair's (listener-bridged caller, responder on a loop)."""
LOOP_RATE_TARGET = 0.8
"""Calls/s at 64 in flight at least this share of the bare loop pair's."""
ROUNDS = 5
RAW_REQUEST = "non-persistent://tg/request/raw-echo"
RAW_RESPONSE = "non-persistent://tg/response/raw-echo"
ASYNC_REQUEST = "non-persistent://tg/request/raw-async-echo"
ASYNC_RESPONSE = "non-persistent://tg/response/raw-async-echo"
LISTENER_REQUEST = "non-persistent://tg/request/raw-listener-echo"
LISTENER_RESPONSE = "non-persistent://tg/response/raw-listener-echo"
LOOP_REQUEST = "non-persistent://tg/request/raw-loop-echo"
LOOP_RESPONSE = "non-persistent://tg/response/raw-loop-echo"
TEXT = "hello, tool"
SIGNED = "bench-echo-signed"


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    stack = Stack(work.make(NAME), registry=True).start()
    try:
        service = spawn(["-m", "bench.serve", "--id", "bench-echo"], stack.env(), stack.workdir / "echo.log")
        stack.processes["echo"] = service
        responder = spawn(
            ["-m", "bench.raw", "responder", stack.url, RAW_REQUEST, RAW_RESPONSE],
            stack.env(),
            stack.workdir / "raw.log",
        )
        stack.processes["raw"] = responder
        async_responder = spawn(
            ["-m", "bench.raw", "async-responder", stack.url, ASYNC_REQUEST, ASYNC_RESPONSE],
            stack.env(),
            stack.workdir / "raw-async.log",
        )
        stack.processes["raw-async"] = async_responder
        listener_responder = spawn(
            ["-m", "bench.raw", "listener-responder", stack.url, LISTENER_REQUEST, LISTENER_RESPONSE],
            stack.env(),
            stack.workdir / "raw-listener.log",
        )
        stack.processes["raw-listener"] = listener_responder
        loop_responder = spawn(
            ["-m", "bench.raw", "loop-responder", stack.url, LOOP_REQUEST, LOOP_RESPONSE],
            stack.env(),
            stack.workdir / "raw-loop.log",
        )
        stack.processes["raw-loop"] = loop_responder
        key_file, _ = generate_key_pair(stack.workdir / "answers.key")
        signed = spawn(
            ["-m", "bench.serve", "--id", SIGNED, "--no-announce"],
            stack.env(TOOLREG_SIGNING_KEY=str(key_file)),
            stack.workdir / "echo-signed.log",
        )
        stack.processes["echo-signed"] = signed
        wait_for_line(stack.workdir / "echo-signed.log", "service.listening", signed)
        wait_for_line(stack.workdir / "raw.log", "raw responder ready", responder)
        wait_for_line(stack.workdir / "raw-async.log", "raw responder ready", async_responder)
        wait_for_line(stack.workdir / "raw-listener.log", "raw responder ready", listener_responder)
        wait_for_line(stack.workdir / "raw-loop.log", "raw responder ready", loop_responder)
        connection = await open_transport(stack.settings)
        try:
            await _configure_signed(connection, key_file)
            async with ToolSet(settings=stack.settings, connection=connection) as tools:
                await Watch(tools).listed(["bench-echo", SIGNED])
                measured = await _measure(stack.url, tools, quick, progress, service.pid)
                return _with_signing(measured, await _signing_cost(tools, quick, progress), key_file, quick)
        finally:
            await connection.close()
    finally:
        stack.stop()


async def _configure_signed(connection: Transport, key_file: Any) -> None:
    """The signed echo's items as the registry writes them for a service it accepted under a trust policy: with the
    public key it signs its answers with."""
    service = echo_class(SIGNED)(announce=False)
    public = public_key_text(load_private_key(key_file).public_key())
    item = service.service_descriptor.model_copy(update={"answer_key": public})
    async with ConfigClient(connection, timeout=10) as config:
        await config.put(
            [("tool-service", SIGNED, item.to_json()), ("tool", SIGNED, service.tool_descriptors[0].to_json())]
        )


def _signing_micro(key_file: Any, rounds: int) -> dict[str, float]:
    """Microseconds to sign one answer (the echo's bytes) and to check it, on this machine's CPU alone."""
    key = load_private_key(key_file)
    sign, check = answer_signer(key), answer_checker(key.public_key())
    data = b'{"end_of_stream":true,"error":null,"response":"hello, tool"}'
    started = time.perf_counter()
    signatures = [sign(f"id{n}", data) for n in range(rounds)]
    signed = time.perf_counter()
    assert all(check(f"id{n}", data, signatures[n]) is None for n in range(rounds))
    checked = time.perf_counter()
    return {"sign_us": (signed - started) / rounds * 1e6, "check_us": (checked - signed) / rounds * 1e6}


async def _ours_sequential(tools: ToolSet, count: int, tool: str = "bench-echo") -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        await tools.invoke(tool, {"text": TEXT})
        samples.append(time.perf_counter() - t0)
    return samples


async def _ours_concurrent(tools: ToolSet, concurrency: int, seconds: float, tool: str = "bench-echo") -> float:
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while loop.time() < stop_at:
            await tools.invoke(tool, {"text": TEXT})
            done += 1

    started = loop.time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (loop.time() - started)


async def _measure(url: str, tools: ToolSet, quick: bool, progress: Progress, service_pid: int) -> dict[str, Any]:
    count = 200 if quick else 1000
    seconds = 1.0 if quick else 3.0
    payload = ToolServiceRequest(user="", config="{}", arguments=json.dumps({"text": TEXT})).model_dump_json().encode()
    await _ours_sequential(tools, 50)  # warm-up: first calls pay for lazy set-up on both sides
    # Interleaved rounds: on a shared 2-core machine latency drifts by tens of
    # percent within a minute, so each figure takes its share of every round
    # rather than having a minute of its own.
    samples: dict[str, list[float]] = {"ours": [], "sync": [], "async": [], "both": [], "listener": [], "loop": []}
    per_round = count // ROUNDS
    for number in range(1, ROUNDS + 1):
        progress.update(f"sequential calls, round {number}/{ROUNDS}: ours and five bare references", force=True)
        samples["ours"] += await _ours_sequential(tools, per_round)
        samples["sync"] += await asyncio.to_thread(
            raw.sequential_rtt, url, RAW_REQUEST, RAW_RESPONSE, payload, per_round
        )
        samples["async"] += (
            await raw.concurrent_rtt(url, RAW_REQUEST, RAW_RESPONSE, payload, 1, 60, max_calls=per_round)
        )[2]
        samples["both"] += (
            await raw.concurrent_rtt(url, ASYNC_REQUEST, ASYNC_RESPONSE, payload, 1, 60, max_calls=per_round)
        )[2]
        samples["listener"] += (
            await raw.listener_rtt(url, LISTENER_REQUEST, LISTENER_RESPONSE, payload, 1, 60, max_calls=per_round)
        )[2]
        samples["loop"] += (
            await raw.listener_rtt(url, LOOP_REQUEST, LOOP_RESPONSE, payload, 1, 60, max_calls=per_round)
        )[2]
    ours, raw_sync, raw_async, raw_both, raw_listener, raw_loop = (
        summary_ms(samples[k]) for k in ("ours", "sync", "async", "both", "listener", "loop")
    )
    if profiling():  # an extra, untimed pass: py-spy slows down what it samples
        progress.update(f"{count} sequential calls under py-spy", force=True)
        with sampled(service_pid, "invoke-service"), sampled(os.getpid(), "invoke-bridge"):
            await _ours_sequential(tools, count)
    throughput: dict[str, dict[str, float]] = {}
    for concurrency in (1, 16, 64):
        progress.update(f"throughput at concurrency {concurrency}", force=True)
        ours_rate = await _ours_concurrent(tools, concurrency, seconds)
        calls, elapsed, _ = await raw.concurrent_rtt(url, RAW_REQUEST, RAW_RESPONSE, payload, concurrency, seconds)
        listened, listen_elapsed, _ = await raw.listener_rtt(
            url, LISTENER_REQUEST, LISTENER_RESPONSE, payload, concurrency, seconds
        )
        looped, loop_elapsed, _ = await raw.listener_rtt(
            url, LOOP_REQUEST, LOOP_RESPONSE, payload, concurrency, seconds
        )
        throughput[str(concurrency)] = {
            "ours_calls_per_s": round(ours_rate, 1),
            "raw_asyncio_calls_per_s": round(calls / elapsed, 1),
            "raw_listener_calls_per_s": round(listened / listen_elapsed, 1),
            "raw_loop_calls_per_s": round(looped / loop_elapsed, 1),
        }
    progress.done(f"p50 {ours['p50_ms']:.3f} ms vs raw {raw_sync['p50_ms']:.3f} ms")
    ratio_p50 = ours["p50_ms"] / raw_sync["p50_ms"]
    ratio_async = ours["p50_ms"] / raw_async["p50_ms"]
    ratio_both = ours["p50_ms"] / raw_both["p50_ms"]
    ratio_listener = ours["p50_ms"] / raw_listener["p50_ms"]
    ratio_loop = ours["p50_ms"] / raw_loop["p50_ms"]
    loop_floor = raw_loop["p50_ms"] / raw_sync["p50_ms"]
    rate_ratio = throughput["64"]["ours_calls_per_s"] / throughput["64"]["raw_listener_calls_per_s"]
    rows: list[dict[str, Any]] = [
        {
            "figure": f"{count} sequential calls, p50",
            "ours": ours["p50_ms"],
            "reference": raw_sync["p50_ms"],
            "unit": "ms",
        },
        {
            "figure": f"{count} sequential calls, p99",
            "ours": ours["p99_ms"],
            "reference": raw_sync["p99_ms"],
            "unit": "ms",
        },
        {
            "figure": "p50 ratio to raw pulsar-client (sync)",
            "ours": round(ratio_p50, 2),
            "reference": 1.0,
            "unit": "x",
            "target": f"<= {TARGET_RATIO:g}x",
            "met": ratio_p50 <= TARGET_RATIO,
        },
        {
            "figure": "p50 ratio to raw, pulsar.asyncio caller, sync responder",
            "ours": round(ratio_async, 2),
            "reference": 1.0,
            "unit": "x",
        },
        {
            "figure": "p50 ratio to raw, pulsar.asyncio at both ends",
            "ours": round(ratio_both, 2),
            "reference": 1.0,
            "unit": "x",
        },
        {
            "figure": "p50 ratio to raw, listener-bridged caller and listener responder",
            "ours": round(ratio_listener, 2),
            "reference": 1.0,
            "unit": "x",
        },
        {
            "figure": "p50 ratio to raw, listener-bridged caller and a responder answering from an event loop",
            "ours": round(ratio_loop, 2),
            "reference": 1.0,
            "unit": "x",
            "target": f"<= {LOOP_P50_TARGET:g}x",
            "met": ratio_loop <= LOOP_P50_TARGET,
        },
        {
            # No product code at all: what the bare client costs a caller and a service that both run on a loop.
            "figure": "no product code: that bare pair on event loops, p50 ratio to raw pulsar-client (sync)",
            "ours": round(loop_floor, 2),
            "reference": 1.0,
            "unit": "x",
        },
    ]
    for concurrency, figures in throughput.items():
        rows.append(
            {
                "figure": f"throughput, concurrency {concurrency}",
                "ours": figures["ours_calls_per_s"],
                "reference": figures["raw_asyncio_calls_per_s"],
                "unit": "calls/s",
            }
        )
    for concurrency, figures in throughput.items():
        rows.append(
            {
                "figure": f"throughput, concurrency {concurrency}, vs raw listener-bridged caller and responder",
                "ours": figures["ours_calls_per_s"],
                "reference": figures["raw_listener_calls_per_s"],
                "unit": "calls/s",
            }
        )
    loop_rate_ratio = throughput["64"]["ours_calls_per_s"] / throughput["64"]["raw_loop_calls_per_s"]
    rows.append(
        {
            "figure": "calls/s at 64 in flight, ratio to the listener-bridged caller and a responder answering from an"
            " event loop",
            "ours": round(loop_rate_ratio, 2),
            "reference": 1.0,
            "unit": "x",
            "target": f">= {LOOP_RATE_TARGET:g}x",
            "met": loop_rate_ratio >= LOOP_RATE_TARGET,
        }
    )
    rows.append(
        {
            "figure": "calls/s at 64 in flight, ratio to raw listener-bridged caller and responder",
            "ours": round(rate_ratio, 2),
            "reference": 1.0,
            "unit": "x",
            "target": f">= {TARGET_RATE_RATIO:g}x (goal 0.8x)",
            "met": rate_ratio >= TARGET_RATE_RATIO,
        }
    )
    return {
        "name": NAME,
        "title": "Invocation overhead",
        "rows": rows,
        "reference_is": (
            "bare pulsar-client request/response (responder and caller, no product code) on the same broker with "
            "the same request bytes: sync API at both ends for sequential latency (the target), also a "
            "pulsar.asyncio caller against the sync responder and pulsar.asyncio at both ends; a "
            "pulsar.asyncio caller for throughput, and a caller on the client's listener and send_async callbacks"
            " (bridged into the loop with call_soon_threadsafe) against a responder on a message listener, and"
            " against a responder whose listener hands each request to an event loop that answers (the floor for a"
            " service on a loop)"
        ),
        "data": {
            "ours": ours,
            "raw_sync": raw_sync,
            "raw_asyncio": raw_async,
            "raw_asyncio_both_ends": raw_both,
            "raw_listener_both_ends": raw_listener,
            "raw_listener_caller_loop_responder": raw_loop,
            "ratio_p50_loop_responder": round(ratio_loop, 3),
            "loop_pair_ratio_to_sync": round(loop_floor, 3),
            "ratio_p50_listener_both_ends": round(ratio_listener, 3),
            "ratio_calls_per_s_64_listener": round(rate_ratio, 3),
            "ratio_p50_sync": round(ratio_p50, 3),
            "ratio_p50_asyncio": round(ratio_async, 3),
            "ratio_p50_asyncio_both_ends": round(ratio_both, 3),
            "throughput": throughput,
            "payload_bytes": len(payload),
        },
    }


async def _signing_cost(tools: ToolSet, quick: bool, progress: Progress) -> dict[str, Any]:
    """Unsigned and signed echo, interleaved round by round: p50 of sequential calls, and calls/s at 64 in flight."""
    count, seconds = (200, 1.0) if quick else (1000, 3.0)
    await _ours_sequential(tools, 50, SIGNED)
    samples: dict[str, list[float]] = {"unsigned": [], "signed": []}
    rates: dict[str, list[float]] = {"unsigned": [], "signed": []}
    for number in range(1, ROUNDS + 1):
        progress.update(f"answer signing, round {number}/{ROUNDS}: unsigned and signed echo", force=True)
        order = ("unsigned", "signed") if number % 2 else ("signed", "unsigned")
        for which in order:
            tool = SIGNED if which == "signed" else "bench-echo"
            samples[which] += await _ours_sequential(tools, count // ROUNDS, tool)
        if number <= 2:
            for which in order:
                tool = SIGNED if which == "signed" else "bench-echo"
                rates[which].append(await _ours_concurrent(tools, 64, seconds, tool))
    return {
        "unsigned": summary_ms(samples["unsigned"]),
        "signed": summary_ms(samples["signed"]),
        "unsigned_calls_per_s_64": round(sum(rates["unsigned"]) / len(rates["unsigned"]), 1),
        "signed_calls_per_s_64": round(sum(rates["signed"]) / len(rates["signed"]), 1),
    }


def _with_signing(result: dict[str, Any], cost: dict[str, Any], key_file: Any, quick: bool) -> dict[str, Any]:
    """The invoke result with the answer-signing rows and data added."""
    micro = _signing_micro(key_file, 500 if quick else 5000)
    unsigned, signed = cost["unsigned"]["p50_ms"], cost["signed"]["p50_ms"]
    rows = [
        {
            "figure": "answer signing: sequential calls, p50 (ours: signed and checked)",
            "ours": signed,
            "reference": unsigned,
            "unit": "ms",
        },
        {
            "figure": "answer signing: calls/s at 64 in flight (ours: signed and checked)",
            "ours": cost["signed_calls_per_s_64"],
            "reference": cost["unsigned_calls_per_s_64"],
            "unit": "calls/s",
        },
        {
            "figure": "answer signing: one signature / one check of an echo answer, CPU alone",
            "ours": round(micro["sign_us"], 1),
            "reference": round(micro["check_us"], 1),
            "unit": "us",
        },
    ]
    result["rows"] += rows
    result["data"]["answer_signing"] = {**cost, **{k: round(v, 2) for k, v in micro.items()}}
    return result
