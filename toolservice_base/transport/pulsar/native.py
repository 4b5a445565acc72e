"""The parts of pulsar-client below its public API that the transport uses, in one place.

`pulsar.asyncio` creates every producer, consumer and reader on a thread of
its own and wraps each callback in a Python closure per message; the hot
paths (`send_async` with one receipt per batch, a listener handing messages
to the loop, a reader taking what is prefetched) need the C++ objects under
it, and the creation calls that take a callback (`subscribe_async_v2`). These
names are pulsar-client's private ones (`_pulsar`, `Client._client`,
`Producer._producer`, `Reader._reader`): the rest of the transport reaches
them only through here, and `tests/transport/test_native_seam.py` fails the
day an upgrade of pulsar-client moves one.
"""

from __future__ import annotations

from typing import Any

import _pulsar
import pulsar.asyncio as pulsar_asyncio

MessageBuilder = _pulsar.MessageBuilder
ConsumerConfiguration = _pulsar.ConsumerConfiguration
BatchReceivePolicy = _pulsar.BatchReceivePolicy
"""What a consumer's `batch_receive` takes at once and how long it waits for more (`BatchedSubscription`)."""
NativeError = _pulsar.Error
"""What a native creation callback is given instead of the object when it failed."""
NativePulsarException = _pulsar.PulsarException
RESULT_OK = _pulsar.Result.Ok


def native_client(client: pulsar_asyncio.Client) -> Any:
    """The C++ client: `subscribe_async_v2` (a consumer created with a callback, no thread) and a `close` that
    does not wait on a loop."""
    return client._client


def native_producer(producer: pulsar_asyncio.Producer) -> Any:
    """The C++ producer: `send_async` and `flush_async` take callbacks."""
    return producer._producer


def native_reader(reader: pulsar_asyncio.Reader) -> Any:
    """The C++ reader: its blocking `read_next` takes a timeout."""
    return reader._reader
