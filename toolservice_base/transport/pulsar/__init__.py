"""The Pulsar transport: the only package that imports `pulsar`.

Every trap in the broker notes is handled here once, so nothing above has to
know them:

- a consumer gets exactly one long-lived `receive()` loop, cancelled only when
  the consumer closes (a cancelled `receive()` eats the next message);
- producers are unbatched (latency matters more than throughput on
  request/response) with a queue sized for bursts, and are flushed and closed
  before the client, before the event loop ends;
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

from .errors import broker_errors, translate
from .transport import CLIENT_LOG, PulsarTransport, client_logger

__all__ = ["CLIENT_LOG", "PulsarTransport", "broker_errors", "client_logger", "translate"]
