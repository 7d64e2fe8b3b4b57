# TLT worker, CUDA: the image of policy and rollout pods on GPU nodes.
# Build from the repository root: docker build -f images/worker-cuda.Dockerfile -t tlt-worker:cuda .
# For runs with rollout.engine vllm: add --build-arg TLT_EXTRAS="[vllm]" (not built or run here: no Docker).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/tlt
ENV PATH=/opt/tlt/bin:$PATH
# torch's CUDA 12.8 build, matching the base image.
RUN pip install --index-url https://download.pytorch.org/whl/cu128 "torch==2.13.0"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tlt ./tlt
COPY operator ./operator
COPY components ./components
# TLT_EXTRAS="[vllm]" also installs vLLM (rollout.engine: vllm); vLLM brings its own pinned torch build.
ARG TLT_EXTRAS=""
RUN pip install ".${TLT_EXTRAS}" && rm -rf /src

# uid/gid 1000 matches the pods' runAsUser (ubuntu images ship user `ubuntu` as 1000: reuse the ids).
RUN (getent passwd 1000 >/dev/null && userdel --remove "$(getent passwd 1000 | cut -d: -f1)" || true) \
 && (getent group 1000 >/dev/null && groupdel "$(getent group 1000 | cut -d: -f1)" || true) \
 && groupadd --gid 1000 tlt && useradd --uid 1000 --gid 1000 --home-dir /home/tlt --no-create-home tlt
USER 1000:1000
ENV HOME=/home/tlt
WORKDIR /var/lib/tlt
# The pods set `command`; clear the base image's entrypoint script so `docker run` behaves the same.
ENTRYPOINT []
CMD ["tlt", "--help"]
