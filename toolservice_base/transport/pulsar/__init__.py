"""The Pulsar transport: the only package that imports `pulsar`.

Every trap in the broker notes is handled here once, so nothing above has to
know them:

- the hot paths never call into `pulsar.asyncio`: a subscription's messages
  arrive on the client's `message_listener` thread and a send's receipt on its
  `send_async` callback, each handed to the event loop through one `LoopBridge`
  (a wake-up per batch, not per message), so no `receive()` is ever pending
  and none can be cancelled and eat a message; a listener's inbox is bounded
  (the listener pauses at `receiver_queue`), and a send waits for a slot
  rather than overflow the producer's queue (`subscription`, `handles`);
- producers are unbatched (latency matters more than throughput on
  request/response) with a queue sized for bursts, and are flushed and closed
  before the client, before the event loop ends; a loop that ends with the
  transport still open closes it first (`asyncio.run` cancels the transport's
  guard task), and a loop closed under pending callbacks has the client closed
  on a thread of its own: no callback ever runs into a closed loop;
- Pulsar exceptions are caught here, by name (they are not all `Exception`
  subclasses of one tree), in one place (`broker_errors`, as httpx maps its
  transport's exceptions), and translated into the product's `TransportError`
  family: none crosses this module's boundary. A bare `Timeout` is not taken
  for an unreachable broker: the broker is asked why (`diagnosis`: a revoked
  permission, an expired or wrong token, a deleted namespace), and consumers
  and producers that stay disconnected are diagnosed and logged while the
  client reconnects (`TopicWatch`, read by `problem`);
- a reader never leaves a read pending in the client: `has_message_available`
  ignores a message already handed to a pending read (measured), and a
  cancelled read loses its message, so reads are blocking calls with a timeout
  on a thread of the reader's own, and what a cancelled call still got is kept
  for the next one;
- an exclusive producer whose creation the caller abandons is closed when the
  broker grants it, so it cannot hold the topic for nobody; a topic taken by
  fencing is held by an Exclusive producer, not an ExclusiveWithFencing one,
  whose reconnect after being fenced would fence the next holder;
- broker-specific workarounds are `Capabilities`, on only for the broker kind
  that needs them (`Capabilities.for_broker`).
"""

from .client_log import CLIENT_LOG, client_logger
from .errors import broker_errors, translate
from .transport import PulsarTransport

__all__ = ["CLIENT_LOG", "PulsarTransport", "broker_errors", "client_logger", "translate"]
