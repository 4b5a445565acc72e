"""`toolreg up` as a real process, flooded: 10,000 bad messages, then a good announcement, which is registered;
then 10,000 announcements with fresh instance ids, which stop at the per-service cap. Its RSS is read from
/proc before and after, and the store version proves bad input wrote nothing."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support import eventually, log_events, toolreg_background, toolreg_env
from support.garbage import batches, corpus, figures, mutated, random_bytes, random_json
from support.registry import announcement

from discovery.broker import EmbeddedBroker
from discovery.registry.validation import AnnouncementValidator, Rejected
from toolservice_base import ConfigClient, open_transport, topics

FLOOD = 10_000
PER_SERVICE_CAP = 256  # RegistryOptions.max_instances_per_service's default
START = 20.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def registry_counts(metrics_url: str) -> dict[str, float]:
    """The registry's `toolreg_registry_*_total` counters, each summed over its labels."""
    with urllib.request.urlopen(metrics_url, timeout=2) as response:
        text = response.read().decode()
    return {
        family.name.removeprefix("toolreg_registry_"): sum(s.value for s in family.samples if s.name.endswith("_total"))
        for family in text_string_to_metric_families(text)
        if family.type == "counter" and family.name.startswith("toolreg_registry_")
    }


def rejections_total(metrics_url: str) -> float:
    return registry_counts(metrics_url).get("rejections", 0.0)


def bad_messages() -> list[bytes]:
    """About a thousand distinct messages the registry must refuse, cycled up to the flood size."""
    valid = [
        announcement("svc", ("a", "b"), ttl=30).to_wire(),
        announcement("svc", kind="heartbeat", sequence=2).to_wire(),
    ]
    candidates = corpus(random_bytes, 300) + corpus(random_json, 300) + corpus(mutated(valid), 500)
    refused = []
    for data in dict.fromkeys(candidates):
        try:
            AnnouncementValidator().check(data, time.time())
        except Rejected:
            refused.append(data)
    refused += [b"x" * 70_000, b"[" * 60_000, b'{"kind": "announce", "instance": "a\\nb"}']
    return [refused[n % len(refused)] for n in range(FLOOD)]


async def send_paced(
    publisher: Any, messages: list[bytes], metrics: str, *, already: int, refused: bool = True
) -> None:
    """Send in batches and wait for the registry to count each batch as refused before the next;
    messages it accepts (`refused=False`) are paced by time instead.

    The topic is non-persistent: the broker drops what a consumer has no
    permits for, and others next to a message over 64 KiB (see `batches`),
    so an unpaced flood would lose messages before they reach the registry
    and prove nothing about it.
    """
    sent = 0
    for chunk in batches(messages, 250):
        await asyncio.gather(*(publisher.send(data) for data in chunk))
        sent += len(chunk)
        if refused:
            expected = already + sent
            await eventually(
                lambda expected=expected: rejections_total(metrics) >= expected,
                timeout=20.0,
                interval=0.05,
                # Say whether messages went missing or were accepted instead of refused.
                explain=lambda expected=expected, sent=sent: (
                    f"{expected} rejections expected after {sent} of {len(messages)} sent; "
                    f"the registry counted {registry_counts(metrics)}"
                ),
            )
        else:
            await asyncio.sleep(0.2)


async def test_a_flood_of_bad_messages_then_a_good_announcement_which_is_registered(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    log = tmp_path / "up.log"
    process = toolreg_background("up", "--metrics-port", "0", env=toolreg_env(broker.url, tmp_path / "up"), log=log)
    connection = await open_transport(url=broker.url)
    try:
        await eventually(lambda: "ready in" in log.read_text(), timeout=START, interval=0.1)
        output = log.read_text()
        assert re.search(r"^trust +no trust policy: every valid announcement is accepted", output, re.M), output
        metrics = re.search(r"^metrics +(http://\S+/metrics)", output, re.M).group(1)  # type: ignore[union-attr]
        client = await ConfigClient(connection, timeout=5).start()
        publisher = await connection.publisher(topics.DEFAULT.tool_descriptors)

        flood = bad_messages()
        await asyncio.gather(*(publisher.send(data) for data in flood[:100]))  # warm up every refusal path
        await publisher.send(announcement("warm", ("warm-tool",), ttl=30).to_json())
        await eventually(lambda: client.list("tool"), timeout=5.0)
        await eventually(lambda: rejections_total(metrics) >= 100, timeout=5.0)
        await asyncio.sleep(0.5)
        version_before = (await client.config())[0]
        before = rss_kib(process.pid)

        started = time.perf_counter()
        await send_paced(publisher, flood, metrics, already=100)
        seconds = time.perf_counter() - started
        after = rss_kib(process.pid)
        assert rejections_total(metrics) == 100 + FLOOD
        assert (await client.config())[0] == version_before, "bad input moved the store's version"

        await publisher.send(announcement("after-flood", ("survivor",), ttl=30).to_json())
        await eventually(lambda: _has(client, "survivor"), timeout=5.0)
        assert process.poll() is None

        # 10,000 valid announcements, each from a fresh instance id of one service: the cap holds. The ttl is the
        # longest allowed so that no lease runs out during the run, however slow the machine: one that did would
        # make room under the cap for a later instance.
        swarm = [
            announcement("swarm", ("swarm-tool",), instance=f"swarm-{n}", ttl=3600).to_json().encode()
            for n in range(FLOOD)
        ]
        await send_paced(publisher, swarm[:PER_SERVICE_CAP], metrics, already=100 + FLOOD, refused=False)
        await eventually(lambda: _instances(client, "swarm", PER_SERVICE_CAP), timeout=20.0, interval=0.1)
        assert rejections_total(metrics) == 100 + FLOOD
        await send_paced(publisher, swarm[PER_SERVICE_CAP:], metrics, already=100 + FLOOD)
        after_swarm = rss_kib(process.pid)
        record = json.loads((await client.get([("discovery", "swarm")]))[("discovery", "swarm")])
        assert len(record["instances"]) == PER_SERVICE_CAP

        text = log.read_text()
        rejected = log_events(text, "announcement.rejected")
        assert len(rejected) == 100 + FLOOD + FLOOD - PER_SERVICE_CAP and all(entry["reason"] for entry in rejected)
        assert not log_events(text, "consumer.handler_failed") and not log_events(text, "request.handler_failed")
        growth = after - before
        assert growth < 30 * 1024, f"registry RSS grew by {growth} KiB over {FLOOD} bad messages"
        assert after_swarm - after < 40 * 1024, (
            f"registry RSS grew by {after_swarm - after} KiB over {FLOOD} fresh instances"
        )
        figures(
            "registry-flood",
            tried=FLOOD,
            crashes=0,
            store_writes_from_bad=0,
            seconds=round(seconds, 2),
            rss_before_kib=before,
            rss_after_kib=after,
            rss_after_swarm_kib=after_swarm,
            swarm_accepted=len(record["instances"]),
            swarm_refused=FLOOD - PER_SERVICE_CAP,
        )
        await client.close()
    finally:
        await connection.close()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _has(client: ConfigClient, name: str) -> bool:
    return name in await client.list("tool")


async def _instances(client: ConfigClient, service: str, count: int) -> bool:
    """The service's ownership record lists `count` instances."""
    value = (await client.get([("discovery", service)])).get(("discovery", service))
    return value is not None and len(json.loads(value)["instances"]) == count
