"""Simulated tool-service instances: raw `Announcement` JSON at a chosen rate, from a process of their own.

The registry's CPU must be measured alone, so the load comes from here, not
from the registry's process or the bench's. Each instance behaves as the
`Announcer` does on the wire: one `announce` (built from the product's own
schemas, digest and all), then `heartbeat`s with a strictly increasing
`sequence`, and a fresh `announce` whenever the registry probes it.

    python -m bench.sim URL --services 400 --instances 5 --tools 5 --ttl 15
    python -m bench.sim URL --services 20000 --instances 5 --tools 1-2 --ttl 30

`--tools LO-HI` gives the services LO to HI tools each, in turn. Driven over
stdin/stdout, one line each way, so the bench can read the registry's
counters between steps:

    -> announce            <- {"announced": N}                every instance, 2,000 a second
    -> wave RATE COUNT     <- {"announced": n, "started": N, "seconds": s}   the next COUNT instances start
                                                               (announce at RATE/s); steps heartbeat those started
    -> step RATE SECONDS   <- {"sent": n, "failed": n, "seconds": s}   heartbeats, round robin
    -> quit

Heartbeats go round robin over the instances (those started, once `wave`
is used), and a step carries on where the last one stopped: steps of a few
seconds each renew every lease in turn, as one long step does.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import pulsar

from toolservice_base import topics
from toolservice_base.schemas import (
    Announcement,
    Probe,
    ToolDescriptor,
    ToolServiceDescriptor,
    descriptor_digest,
)

TICK = 0.005


class Instance:
    __slots__ = ("id", "service", "tools", "digest", "sequence", "ttl", "prefix")

    def __init__(
        self, instance_id: str, service: ToolServiceDescriptor, tools: list[ToolDescriptor], digest: str, ttl: float
    ) -> None:
        self.id, self.service, self.tools, self.digest, self.ttl = instance_id, service, tools, digest, ttl
        self.sequence = 0
        # A heartbeat is tiny and fixed but for two numbers: format it, do not rebuild a model per message.
        self.prefix = (
            f'{{"kind":"heartbeat","instance":"{instance_id}","ttl":{ttl},'
            f'"workspace":"default","digest":"{digest}","version":"sim",'
        )

    def announce(self) -> bytes:
        self.sequence += 1
        return (
            Announcement(
                kind="announce",
                instance=self.id,
                sequence=self.sequence,
                sent_at=time.time(),
                ttl=self.ttl,
                digest=self.digest,
                service=self.service,
                tools=self.tools,
                version="sim",
            )
            .to_json()
            .encode()
        )

    def heartbeat(self, now: float) -> bytes:
        self.sequence += 1
        return f'{self.prefix}"sequence":{self.sequence},"sent-at":{now}}}'.encode()


def tool_counts(text: str) -> tuple[int, ...]:
    """`--tools`: "5" (each service 5 tools) or "1-2" (services take 1, 2, 1, 2, ... tools in turn)."""
    low, _, high = text.partition("-")
    first, last = int(low), int(high or low)
    if not 0 < first <= last:
        raise argparse.ArgumentTypeError(f"--tools {text!r}: give N or LO-HI with 0 < LO <= HI")
    return tuple(range(first, last + 1))


def population(services: int, instances: int, tools: int | tuple[int, ...], ttl: float, prefix: str) -> list[Instance]:
    """`services` services of `tools` tools each (taken in turn from a tuple), `instances` instances of each."""
    counts = (tools,) if isinstance(tools, int) else tools
    out: list[Instance] = []
    for s in range(services):
        service_id = f"{prefix}-svc-{s}"
        service = ToolServiceDescriptor.model_validate(
            {
                "id": service_id,
                "request-queue": topics.DEFAULT.request_queue(service_id),
                "response-queue": topics.DEFAULT.response_queue(service_id),
            }
        )
        tool_list = [
            ToolDescriptor.model_validate(
                {
                    "type": "tool-service",
                    "name": f"{service_id}-tool-{t}",
                    "service": service_id,
                    "description": f"Simulated tool {t} of {service_id}",
                    "arguments": [{"name": "text", "type": "string", "description": "Some text"}],
                }
            )
            for t in range(counts[s % len(counts)])
        ]
        digest = descriptor_digest(service, tool_list)
        out.extend(Instance(f"{service_id}-i{i}", service, tool_list, digest, ttl) for i in range(instances))
    return out


class Simulator:
    def __init__(self, url: str, instances: list[Instance], topic: str = topics.DEFAULT.tool_descriptors) -> None:
        self.instances = instances
        self.by_id = {inst.id: inst for inst in instances}
        self.client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        self.producer = self.client.create_producer(
            topic, batching_enabled=False, max_pending_messages=50_000, block_if_queue_full=True
        )
        self.lock = threading.Lock()  # the probe listener thread sends too: keep each instance's sequence in wire order
        self.index = 0
        """The next instance to heartbeat: a step carries on where the previous one stopped."""
        self.started: int | None = None
        """Instances started so far by `wave` (the first ones); None: all of them (`announce`, or none announced)."""
        self.failed = 0
        self.probes_answered = 0
        self.client.subscribe(topics.DEFAULT.tool_probe, f"sim-probe-{time.time_ns()}", message_listener=self._on_probe)

    def _sent(self, result: pulsar.Result, _msg_id: object) -> None:
        if result != pulsar.Result.Ok:
            self.failed += 1

    def _on_probe(self, consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        consumer.acknowledge(message)
        try:
            probe = Probe.model_validate_json(message.data())
        except ValueError:
            return
        if probe.refused is not None:  # a notice of refusal, not a request to announce again
            return
        targets = [self.by_id[probe.instance]] if probe.instance in self.by_id else []
        with self.lock:
            for inst in targets:
                self.producer.send_async(inst.announce(), self._sent)
                self.probes_answered += 1

    def announce(self, per_second: float = 2000.0) -> int:
        self.started = None
        for number, inst in enumerate(self.instances):
            with self.lock:
                self.producer.send_async(inst.announce(), self._sent)
            if number % 100 == 99:
                time.sleep(100 / per_second)
        self.producer.flush()
        return len(self.instances)

    def wave(self, per_second: float, count: int) -> dict[str, float]:
        """The next `count` instances start: each announces, `per_second` of them a second; from then on `step`
        heartbeats them too. A fleet started wave by wave, as a deployment rolls out, never has an instance
        waiting longer than one wave for its first heartbeat."""
        first = self.started if self.started is not None else 0
        last = min(len(self.instances), first + count)
        started = time.perf_counter()
        for number in range(first, last):
            with self.lock:
                self.producer.send_async(self.instances[number].announce(), self._sent)
            if (number - first) % 100 == 99:
                time.sleep(max(0.0, started + (number - first + 1) / per_second - time.perf_counter()))
        self.producer.flush()
        self.started = last
        return {"announced": last - first, "started": last, "seconds": round(time.perf_counter() - started, 3)}

    def _beat(self, rate: float, seconds: float) -> int:
        """Heartbeats at `rate` per second for `seconds`, in 5 ms ticks, round robin over the instances started."""
        count = self.started if self.started is not None else len(self.instances)
        sent, index = 0, self.index % count
        started = time.perf_counter()
        end = started + seconds
        while (now := time.perf_counter()) < end:
            due = int((now - started) * rate) - sent
            wall = time.time()
            if due > 0:
                with self.lock:
                    for _ in range(due):
                        self.producer.send_async(self.instances[index].heartbeat(wall), self._sent)
                        index = (index + 1) % count
                sent += due
            time.sleep(TICK)
        self.index = index
        return sent

    def step(self, rate: float, seconds: float) -> dict[str, float]:
        """Heartbeats at `rate` per second for `seconds`, paced in 5 ms ticks, round robin over the instances."""
        failed_before = self.failed
        started = time.perf_counter()
        sent = self._beat(rate, seconds)
        self.producer.flush()
        return {
            "sent": sent,
            "failed": self.failed - failed_before,
            "seconds": round(time.perf_counter() - started, 3),
            "probes_answered": self.probes_answered,
        }

    def close(self) -> None:
        self.producer.flush()
        self.client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--services", type=int, default=400)
    parser.add_argument("--instances", type=int, default=5, help="instances per service")
    parser.add_argument("--tools", type=tool_counts, default=(5,), help="tools per service: N, or LO-HI taken in turn")
    parser.add_argument("--ttl", type=float, default=15.0)
    parser.add_argument("--prefix", default="sim")
    parser.add_argument(
        "--topic",
        default=topics.DEFAULT.tool_descriptors,
        help="where to publish (a scratch topic measures the broker alone)",
    )
    args = parser.parse_args()
    sim = Simulator(args.url, population(args.services, args.instances, args.tools, args.ttl, args.prefix), args.topic)
    print(json.dumps({"ready": len(sim.instances)}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "announce":
            print(json.dumps({"announced": sim.announce()}), flush=True)
        elif words[0] == "wave":
            print(json.dumps(sim.wave(float(words[1]), int(words[2]))), flush=True)
        elif words[0] == "step":
            print(json.dumps(sim.step(float(words[1]), float(words[2]))), flush=True)
        elif words[0] == "quit":
            break
    sim.close()


if __name__ == "__main__":
    main()
