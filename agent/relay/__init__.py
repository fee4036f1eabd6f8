"""The per-host relay: one channel to the coordinator for every worker process on this host.

The launcher runs it (``python -m foldplane.agent.launch`` does by default) as a small HTTP server on
``127.0.0.1`` at a free port, and gives its workers ``FOLDPLANE_RELAY``; each worker's agent then
sends its events and long-polls its updates through the relay as it would to a coordinator
(docs/protocol.md, "The per-host relay"), while the relay speaks to the coordinator over host
channels (``GET /agents/channel``, ``agent.channel``), exactly as the simulated hosts do: the
coordinator holds a few connections per host instead of one per rank, and reads no HTTP request
per batch or per update. The relay serves exactly the two agent endpoints:

- ``POST /agents/events``: each worker request's events are queued; while one upstream batch is
  in flight, what arrives goes into the next one (up to ``MAX_EVENTS`` events and
  ``MAX_BATCH_BYTES``); requests of nothing but heartbeats have such a lane of their own. The
  relay attaches each worker's agent token (its ``Authorization`` header) to that worker's
  events as ``"token"``, so the coordinator still checks every event against its own rank; the
  answer's results are split back to each worker in order. A batch whose every event carries a
  token goes on a channel whose door token is one of such a batch (one channel, kept open for
  the later ones: each event is decided by its own token, the door only lets it in); a batch of
  events without tokens goes on a channel opened with no token at all, so that such an event
  never travels with another worker's credentials. A merged batch that the coordinator refuses
  as a whole (``REFUSED``: a forged door token, say) is sent again request by request, each
  with its own token at the door, so that each worker gets the answer it alone would have got.
- ``GET /agents/updates``: per ``(group, protocol)`` a *lane* keeps ONE channel open carrying
  the local ranks (``ranks=...``, one agent token per rank at the door), from the lowest offset
  they need, and opens it again when it ends or the ranks it should carry change. What the
  coordinator pushes on it is cached per rank by offset (:class:`UpdateCache`), and each
  worker's poll is answered from the cache, at once when a push brings something: the group's
  updates and its own rank's, after its own ``after``. A rank joins the lane only once a poll
  of its own, forwarded upstream over HTTP with its own token, succeeded: the coordinator, not
  the relay, decides who speaks for a rank, and a wrong token never breaks the lane's channel
  for the others. A poll the cache cannot answer (an ``after`` below what the relay still holds,
  a token other than the one the coordinator accepted, a rank the lane's channel does not carry
  yet) is forwarded upstream on its own.

One event loop, in a thread of the relay's own, runs every channel (:class:`Upstream`); the
workers' request threads hand it their work and wait for the answer with a deadline. An
upstream failure reaches the worker as the error it would have got from the coordinator: its
status and error body (a refused opening, or a batch it could not take), or ``503
coordinator_unavailable`` when no coordinator answered, the channel was lost, or no answer
came in time. Openings follow leader redirects over the launcher's list of coordinator
addresses (:class:`~agent.channel.ChannelLink`). Everything else an agent does (looking its
group up, proposals) and the launcher's death reports still go to the coordinator directly.

The parts, each a module of this package: ``replies`` (what a worker is answered, the counters),
``events`` (the events lanes: merge, send, split), ``cache`` (the updates a lane holds),
``lanes`` (the updates lanes), ``upstream`` (the loop and the events channels) and ``server``
(:class:`Relay`, the HTTP server that joins them).
"""

from .cache import CACHE_BYTES, Served, Span, UpdateCache
from .events import EventsLane, EventsRequest, split_results, take_batch, with_token
from .lanes import PollArgs, UpdatesLane
from .replies import Counters, Reply, error, passed_on
from .server import Relay
from .upstream import Unreachable, Upstream, channel_addresses

__all__ = [
    "CACHE_BYTES",
    "Counters",
    "EventsLane",
    "EventsRequest",
    "PollArgs",
    "Relay",
    "Reply",
    "Served",
    "Span",
    "Unreachable",
    "UpdateCache",
    "UpdatesLane",
    "Upstream",
    "channel_addresses",
    "error",
    "passed_on",
    "split_results",
    "take_batch",
    "with_token",
]
