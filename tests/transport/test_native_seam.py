"""pulsar-client's private parts the transport stands on (`transport/pulsar/native.py`) are still where it looks.

An upgrade of pulsar-client that renames one fails here, by name, instead of as an AttributeError on a client
thread in production.
"""

from __future__ import annotations

import inspect
import uuid

import pulsar
import pulsar.asyncio as pulsar_asyncio

from discovery.broker import EmbeddedBroker
from toolservice_base.transport.pulsar import native


def test_the_native_names_the_transport_uses_exist() -> None:
    assert callable(native.MessageBuilder) and callable(native.ConsumerConfiguration)
    assert issubclass(native.NativePulsarException, BaseException)
    assert native.RESULT_OK is not None and inspect.isclass(native.NativeError)
    for method in ("content", "property", "build"):
        assert hasattr(native.MessageBuilder(), method), method
    for method in ("consumer_type", "receiver_queue_size", "schema", "message_listener", "batch_receive_policy"):
        assert hasattr(native.ConsumerConfiguration(), method), method
    assert callable(native.BatchReceivePolicy)


async def test_a_clients_producers_and_readers_native_objects_have_what_the_transport_calls(
    broker: EmbeddedBroker,
) -> None:
    client = pulsar_asyncio.Client(broker.url)
    topic = f"non-persistent://public/default/seam-{uuid.uuid4().hex[:8]}"
    try:
        for method in ("subscribe_async_v2", "close"):
            assert hasattr(native.native_client(client), method), method
        producer = await client.create_producer(topic)
        for method in ("send_async", "flush_async", "is_connected"):
            assert hasattr(native.native_producer(producer), method), method
        reader = await client.create_reader(topic, pulsar.MessageId.latest)
        assert hasattr(native.native_reader(reader), "read_next")
        await reader.close()
        await producer.close()
    finally:
        await client.close()


def test_the_tracing_fast_path_still_reads_the_global_provider_the_api_sets() -> None:
    """`toolservice_base.tracing` reads OpenTelemetry's private `_TRACER_PROVIDER` (the public getter looks up an
    environment variable on every call); the day the API renames it, the fast path would silently switch off."""
    import subprocess
    import sys

    from toolservice_base import tracing

    assert tracing._READ_GLOBAL, "opentelemetry-api no longer has trace._TRACER_PROVIDER: see toolservice_base/tracing"
    script = (
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from toolservice_base import tracing\n"
        "assert tracing.tracer() is None\n"
        "provider = TracerProvider()\n"
        "trace.set_tracer_provider(provider)\n"
        "assert trace._TRACER_PROVIDER is provider is trace.get_tracer_provider()\n"
        "assert tracing.tracer() is not None\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
