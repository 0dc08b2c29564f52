"""Which calls gRPC itself sends again, and how: the retry policy every channel of
rdurack carries (`server.channel`), as gRPC's JSON service config.

A call is retried only when its server answered UNAVAILABLE (down, restarting, a
connection lost) and only when sending it again cannot do anything twice: the reads,
and `WatchJob` until its first event arrives (gRPC commits a stream then, and never
retries it after). Not on the list:

- `Heartbeat`: the health watcher's probe; a retried probe would hide, for its backoff,
  the failure it exists to see (the watcher counts missed beats itself).
- `SubmitJob`: sending it again is safe only with a `client_request_id`, which clients
  may leave empty; a caller that always sets one (`make chaos`) adds it (`SUBMIT_JOB`).
- every call that changes something (reserve, run, cancel, faults), and the links'
  data plane (node_agent/, whose channels are its own).

The orchestrator's own "retry later" for agent refusals (`node_gateway.RETRYABLE`:
busy sockets, an agent away for longer than a call) re-places a job; no channel can.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

# "package.Service/Method", as gRPC's service config names a method.
IDEMPOTENT = frozenset(
    {
        "rdurack.v1.JobService/GetJob",
        "rdurack.v1.JobService/GetJobLogs",
        "rdurack.v1.JobService/ListJobs",
        "rdurack.v1.JobService/WatchJob",
        "rdurack.v1.RackService/GetRack",
        "rdurack.v1.RackService/ListNodes",
        "rdurack.v1.RackService/RegisterNode",  # the same address again is no change
        "rdurack.v1.AdminService/ListFaults",
        "rdurack.v1.NodeAgentService/GetNode",
        "rdurack.v1.NodeAgentService/ListFaults",
    }
)
SUBMIT_JOB = "rdurack.v1.JobService/SubmitJob"

# Three attempts, the waits between them drawn from [0, 0.1 s] and [0, 0.2 s]: enough to
# ride over a reconnect (a restarted agent, a dropped connection), short enough that a
# peer that is really down costs a caller at most 0.3 s more than it did.
RETRY_POLICY = {
    "maxAttempts": 3,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
# gRPC's retry throttling, per server: every failed attempt takes a token, every
# success gives back 0.1, and retries stop below half of 10. A server that stays down
# (a killed agent the scheduler still asks about every round) is then asked once per
# call again, not three times with waits.
RETRY_THROTTLING = {"maxTokens": 10, "tokenRatio": 0.1}


def service_config(methods: Iterable[str] = IDEMPOTENT) -> str:
    """gRPC's service config (the `grpc.service_config` channel argument): RETRY_POLICY
    for `methods`, each "package.Service/Method"."""
    names = [
        {"service": service, "method": method}
        for service, _, method in (m.partition("/") for m in sorted(methods))
    ]
    config: dict[str, object] = {"retryThrottling": RETRY_THROTTLING}
    if names:
        config["methodConfig"] = [{"name": names, "retryPolicy": RETRY_POLICY}]
    return json.dumps(config)
