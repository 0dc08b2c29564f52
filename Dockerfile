# rdurack image: the node agent, the orchestrator and the Ray head all run from it
# (k8s/ picks the command). Not built on the build machines (no container engine);
# see README "Kubernetes".
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The root filesystem is read-only in the pods; /tmp is a writable emptyDir there,
    # and Ray and Python write under HOME.
    HOME=/tmp

WORKDIR /opt/rdurack
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY rdurack ./rdurack

# Generate the gRPC code into the package before installing it, as `make proto` does
# (without the mypy stubs, a dev-only concern). grpcio-tools is a runtime dependency,
# so the first install brings protoc; no dev tools are installed.
# torch's CPU build from its own index first: PyPI's torch==2.13.0 is the CUDA build
# (several GB) that the sockets never use.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
RUN pip install . \
 && rm -rf rdurack/v1 && mkdir -p rdurack/v1 \
 && python -m grpc_tools.protoc -I proto --python_out=. --grpc_python_out=. \
      $(find proto -name '*.proto' | sort) \
 && echo '"""Generated at image build from proto/rdurack/v1; never edit."""' > rdurack/v1/__init__.py \
 && pip install --no-deps --force-reinstall . \
 && python -c "import rdurack.v1.job_pb2_grpc, rdurack.processes.orchestrator_main" \
 && rm -rf /opt/rdurack/build

# A non-root user with a fixed uid: the manifests' runAsUser and fsGroup are 10001.
RUN groupadd --system --gid 10001 rdurack \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin rdurack
USER 10001:10001

# The pods override the command; by default the image explains itself.
CMD ["rdu", "--help"]
