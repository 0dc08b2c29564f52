"""The floor of the SubmitJob and WatchJob figures: a bare grpcio server making the same
durable write, as a process of its own.

`python -m rdurack.devtools.bench_floor --store WHERE` serves two methods under the
JobService's names, so that bench_loadgen.py loads it exactly as it loads the
orchestrator:

- SubmitJob: decodes the request, then `JobStore.submit` of the bench's small job, on
  the same store class the orchestrator uses (SQLite with its group commit, or
  PostgreSQL), committed and durable before the answer; answers the job's id and state.
- WatchJob: `JobStore.events` of the job, each sent as it is read, then the stream ends.

What it leaves out is what the orchestrator adds on top of gRPC and the store: tracing,
the request guard, tokens, the spec's conversion and validation (the spec is converted
once, at start), quotas, waking the scheduler and the watchers, the job's full answer,
and the rack's own work. Its threads are the orchestrator's: SubmitJob runs on a pool
of QUICK_WORKERS of its own (api/quick_calls.py), WatchJob on the server's pool of
SERVER_WORKERS, so that both meet the load with the same threads. It prints
`floor ready at HOST:PORT` once it serves and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import gc
import signal
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures

import grpc

from rdurack.api.quick_calls import QUICK_WORKERS, InPool
from rdurack.devtools.bench_loadgen import small_job
from rdurack.orchestrator.store import JobStore
from rdurack.processes.orchestrator_main import SERVER_WORKERS
from rdurack.v1 import common_pb2, job_pb2
from rdurack.wire import jobs as jc

JOB_SERVICE = job_pb2.DESCRIPTOR.services_by_name["JobService"].full_name
PLATFORM = "sn40l-rack16"  # the bench rack's, which the orchestrator stamps on each spec


def serve(
    store: JobStore, quick: futures.ThreadPoolExecutor, host: str = "127.0.0.1", port: int = 0
) -> tuple[grpc.Server, str]:
    """A started bare server on `store`, SubmitJob on `quick`, and its address."""
    spec = jc.spec_from_proto(small_job("floor").spec, PLATFORM)

    def submit(
        request: job_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.SubmitJobResponse:
        job, _ = store.submit(uuid.uuid4().hex[:12], spec)
        return job_pb2.SubmitJobResponse(
            job=job_pb2.Job(id=job.id, state=common_pb2.JOB_STATE_PENDING)
        )

    def watch(
        request: job_pb2.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[job_pb2.JobEvent]:
        for event in store.events(request.job_id):
            yield job_pb2.JobEvent(job_id=event.job_id, sequence=event.seq)

    handlers = grpc.method_handlers_generic_handler(
        JOB_SERVICE,
        {
            "SubmitJob": grpc.unary_unary_rpc_method_handler(
                InPool(submit, quick),
                request_deserializer=job_pb2.SubmitJobRequest.FromString,
                response_serializer=job_pb2.SubmitJobResponse.SerializeToString,
            ),
            "WatchJob": grpc.unary_stream_rpc_method_handler(
                watch,
                request_deserializer=job_pb2.WatchJobRequest.FromString,
                response_serializer=job_pb2.JobEvent.SerializeToString,
            ),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVER_WORKERS))
    server.add_generic_rpc_handlers((handlers,))
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, f"{host}:{bound}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="a SQLite file or a postgresql:// URL")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    quick = futures.ThreadPoolExecutor(max_workers=QUICK_WORKERS)
    with JobStore(args.store) as store:
        server, address = serve(store, quick, port=args.port)
        # As the orchestrator does once it serves (processes/orchestrator_main.py): what
        # start-up made, frozen out of the collector's reach. Without it the floor's
        # full collections, walking every module and object start-up made, set its p99
        # (up to 14 ms against the orchestrator's 7 in the same rounds).
        gc.freeze()
        print(f"floor ready at {address}", flush=True)
        stop.wait()
        server.stop(1.0).wait()
        quick.shutdown(wait=True)


if __name__ == "__main__":
    main()
