"""Span and attribute names: the one list of what a trace of the rack may contain.

RPC spans follow the OpenTelemetry semantic conventions for RPC (`rpc.*`); rdurack's
own attributes live under `rdurack.`. Hardware spans are on the emulated timeline
(docs/data-plane.md, "Tracing").
"""

from __future__ import annotations

# ---------------------------------------------------------------- spans
SPAN_SCHEDULE = "orchestrator.schedule"  # a scheduling round that placed jobs
SPAN_JOB = "job"  # one run (attempt) of a job, on the orchestrator
SPAN_NODE_KERNEL = "node_agent.run_kernel"  # a node agent driving its sockets' kernels
SPAN_NODE_COLLECTIVE = "node_agent.collective"  # ... and its sockets' part of a collective
SPAN_KERNEL = "rdu.kernel"  # a socket running a kernel (emulated timeline)
SPAN_SERVE_PREFILL = "rdu.serve.prefill"  # a serve job's prefill on a socket (emulated)
SPAN_SERVE_DECODE = "rdu.serve.decode"  # a serve job's run of decode iterations (emulated)
SPAN_PASS = "rdu.serve.pass"  # one forward pass of an endpoint's engine (emulated)
SPAN_COLLECTIVE = "rdu.collective"  # a socket's part of a collective (emulated timeline)
SPAN_NODE_PROGRAM = "node_agent.run_program"  # a node agent driving a program (CoE batch)
SPAN_DEPLOY = "rdu.bundle_deploy"  # a socket loading its share of a model bundle
SPAN_EXPERT_SWITCH = "rdu.expert_switch"  # an expert copied DDR -> HBM (or a hit)
SPAN_GENERATE = "rdu.generate"  # functional mode: a tiny expert generating tokens
SPAN_TRAIN = "rdu.train"  # a segment of training steps of one DDP rank (emulated timeline)
SPAN_NODE_TRAIN = "node_agent.train"  # a node agent driving its ranks' segment
SPAN_TRAIN_STAGE = "rdu.train.stage"  # one stage of a rank's training (emulated timeline)
SPAN_TRAIN_FREEZE = "rdu.train.freeze"  # a grown block frozen, the next moved in (emulated)
SPAN_TRAIN_STEP = "rdu.train.step"  # one optimizer step of a rank (emulated, bounded)
SPAN_TRAIN_ALLREDUCE = "rdu.train.allreduce"  # a step's gradient all-reduce (emulated)
SPAN_CHECKPOINT = "rdu.checkpoint"  # a rank writing or loading a checkpoint (emulated)
SPAN_TRANSFER = "rdu.transfer"  # one send of a socket's part of a collective (emulated)
# The endpoint (`rdu serve`): an HTTP completion request is one trace. Its root is the
# SERVER span named as the HTTP semantic conventions name it ("{method} {route}"); its
# children lie on the request's emulated timeline (endpoint/tracing.py).
SPAN_HTTP_COMPLETIONS = "POST /v1/completions"
SPAN_HTTP_CHAT = "POST /v1/chat/completions"
SPAN_REQUEST_QUEUE = "endpoint.queue"  # a request waiting for its admission (emulated)
SPAN_REQUEST_PREFILL = "endpoint.prefill"  # admission to its first token (emulated)
SPAN_REQUEST_DECODE = "endpoint.decode"  # its decode iterations (emulated, <= 128 a span)
EVENT_ITERATION = "endpoint.iteration"  # an event: one iteration the request was in
SPAN_ENDPOINT_PASSES = "endpoint.passes"  # one call of the engine's passes to a rack

# RPCs that get no span: the health watcher's heartbeats (several a second, forever)
# would bury the traces of jobs.
UNTRACED_METHODS = frozenset({"/rdurack.v1.NodeAgentService/Heartbeat"})

# Instrumentation scope names (the tracer's name).
TRACER_ORCHESTRATOR = "rdurack.orchestrator"
TRACER_NODE_AGENT = "rdurack.node_agent"
TRACER_SOCKET = "rdurack.socket"
TRACER_GRPC = "rdurack.grpc"
TRACER_ENDPOINT = "rdurack.endpoint"

# ---------------------------------------------------------------- semantic conventions
SERVICE_NAME = "service.name"
RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"
RPC_METHOD = "rpc.method"
RPC_GRPC_STATUS_CODE = "rpc.grpc.status_code"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
ERROR_TYPE = "error.type"
# Generative AI (gen_ai.*): the request's model and tokens; the latencies are the names
# vLLM's request spans use (emulated seconds here).
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_LATENCY_QUEUE = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_TTFT = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"

# ---------------------------------------------------------------- rdurack attributes
ATTR_JOB_ID = "rdurack.job.id"
ATTR_JOB_MODEL = "rdurack.job.model"
ATTR_JOB_PHASE = "rdurack.job.phase"
ATTR_JOB_SOCKETS = "rdurack.job.sockets"  # the socket ids of the job (a list)
ATTR_JOB_ATTEMPT = "rdurack.job.attempt"
ATTR_JOBS_PLACED = "rdurack.schedule.jobs_placed"
ATTR_NODE = "rdurack.node.index"
ATTR_SOCKET = "rdurack.socket.id"
ATTR_SOCKETS = "rdurack.socket.ids"  # the sockets an agent call drives (a list)
ATTR_EMULATED_START_NS = "rdurack.emulated.start_ns"  # the socket's emulated clock
ATTR_EMULATED_NS = "rdurack.emulated.duration_ns"
ATTR_KERNEL_CALLS = "rdurack.kernel.calls"
ATTR_STEPS = "rdurack.kernel.steps"
ATTR_FUSION_PLAN = "rdurack.kernel.fusion_plan"
ATTR_HBM_BYTES = "rdurack.memory.hbm.bytes"  # HBM traffic of a kernel
ATTR_SEQUENCE_LENGTH = "rdurack.kernel.sequence_length"  # prompt, or decode context, tokens
ATTR_BYTES = "rdurack.bytes"  # a collective's buffer size (timing mode)
ATTR_BYTES_SENT = "rdurack.link.bytes_sent"
ATTR_BYTES_RECEIVED = "rdurack.link.bytes_received"
ATTR_FLOPS = "rdurack.flops"  # FLOPs a socket executed for a kernel span, all its steps
ATTR_LINK = "rdurack.link.name"  # one direction of a link, "rdu-n0-s0->rdu-n0-s1"
ATTR_LINK_KIND = "rdurack.link.kind"  # intra-node or inter-node
ATTR_LINKS = "rdurack.link.names"  # the links an operation sent on (a list)
ATTR_LINK_KINDS = "rdurack.link.kinds"  # ... their kinds, in the same order (a list)
ATTR_TRANSFERS = "rdurack.link.transfers"  # sends a socket made in a collective
ATTR_TRANSFERS_UNTRACED = "rdurack.link.transfers_untraced"  # ... with no rdu.transfer span
ATTR_COLLECTIVE_OP = "rdurack.collective.op"
ATTR_COLLECTIVE_ALGORITHM = "rdurack.collective.algorithm"
ATTR_COLLECTIVE_TAG = "rdurack.collective.tag"
# A collective priced inside a kernel's step and drawn from the schedule it was priced
# with: its sends were not made over gRPC (node_agent/timeline/step_collectives.py).
ATTR_COLLECTIVE_DRAWN = "rdurack.collective.drawn"
ATTR_COLLECTIVE_PER_STEP = "rdurack.collective.per_step"  # times one step runs it
ATTR_MOE_ROLE = "rdurack.moe.role"  # an MoE layer's all-reduce: dispatch or combine
ATTR_GROUP_SIZE = "rdurack.collective.group_size"
ATTR_KERNEL_ROLE = "rdurack.kernel.role"  # CoE: router, prefill or decode
ATTR_BATCH = "rdurack.kernel.batch"  # sequences a kernel processes together
ATTR_PASS_TOKENS = "rdurack.pass.tokens"  # new tokens of an endpoint's forward pass
ATTR_KV_TOKENS = "rdurack.pass.kv_tokens"  # KV-cache tokens its requests hold
ATTR_SERVE_FIRST_ITERATION = "rdurack.serve.first_iteration"  # a decode span's first, from 0
ATTR_REQUEST = "rdurack.serve.request"  # the endpoint engine's index of a request, from 0
ATTR_ITERATION = "rdurack.serve.iteration"  # the engine's index of an iteration, from 0
ATTR_TOKEN = "rdurack.serve.token"  # the request's output token an iteration gave, from 0
ATTR_PREFILL_TOKENS = "rdurack.serve.prefill_tokens"  # prompt tokens an iteration prefilled
ATTR_DRAFT_MODEL = "rdurack.serve.draft_model"  # speculative decoding's draft
ATTR_DRAFT_TOKENS = "rdurack.serve.draft_tokens"  # tokens drafted per iteration
ATTR_TIER = "rdurack.memory.tier"  # the tier (or "src->dst" tiers) a span's bytes use
ATTR_EXPERT = "rdurack.coe.expert"
ATTR_EXPERTS = "rdurack.coe.experts"  # experts in a bundle
ATTR_SWITCH_HIT = "rdurack.coe.switch.hit"  # the expert was already in HBM
ATTR_EVICTED = "rdurack.coe.switch.evicted"  # experts evicted to make room (a list)
ATTR_PLATFORM = "rdurack.platform"  # the platform a job emulates (sn40l, dgx-a100, ...)
ATTR_TOKENS = "rdurack.coe.tokens"  # tokens generated
ATTR_RANK = "rdurack.train.rank"  # a DDP rank
ATTR_STEP = "rdurack.train.step"  # optimizer steps done
ATTR_LOSS = "rdurack.train.loss"  # the rank's local batch loss after a step
ATTR_STEPS_UNTRACED = "rdurack.train.steps_untraced"  # a segment's steps with no step span
ATTR_TRAIN_PREPARE = "rdurack.train.prepare"  # a node's call that starts its ranks, no step
ATTR_BUCKETS = "rdurack.train.buckets"  # gradient buckets all-reduced in a step
ATTR_ALLREDUCE_NS = "rdurack.train.allreduce_ns"  # gradient all-reduce time, emulated ns
ATTR_EXPOSED_NS = "rdurack.train.exposed_ns"  # ... the part backward did not hide
ATTR_TRAIN_STAGE = "rdurack.train.stage"  # a stage's name: "full", "grow block 2", ...
ATTR_TRAIN_PHASE = "rdurack.train.phase"  # full, shrink or grow
ATTR_TRAIN_BLOCK = "rdurack.train.block"  # the block a progressive stage trains, from 0
ATTR_TRAIN_MOVEMENT = "rdurack.train.movement"  # the last window's effective movement
ATTR_TRAIN_CONVERGED = "rdurack.train.converged"  # ended by the movement metric
ATTR_TRAIN_ACCURACY = "rdurack.train.accuracy"  # the stage's test accuracy (rank 0)
ATTR_CHECKPOINT_ACTION = "rdurack.checkpoint.action"  # save (rank 0) or load
ATTR_CHECKPOINT_PATH = "rdurack.checkpoint.path"  # the checkpoint's file
# The peak bytes of one tier during a span, {tier} one of sram, hbm, ddr.
ATTR_PEAK_BYTES = "rdurack.memory.{tier}.peak_bytes"
