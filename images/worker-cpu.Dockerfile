# TLT worker, CPU: the image of policy, rollout and verifier pods on CPU nodes.
# Build from the repository root: docker build -f images/worker-cpu.Dockerfile -t tlt-worker:cpu .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
# torch's CPU build first: an unpinned torch would pull the multi-GB CUDA build.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tlt ./tlt
COPY operator ./operator
COPY components ./components
RUN pip install . && rm -rf /src

# uid/gid 1000 matches the pods' runAsUser; HOME, /tmp and /dev/shm are emptyDirs at run time
# (the root file system is read-only).
RUN groupadd --gid 1000 tlt && useradd --uid 1000 --gid 1000 --home-dir /home/tlt --no-create-home tlt
USER 1000:1000
ENV HOME=/home/tlt
WORKDIR /var/lib/tlt
CMD ["tlt", "--help"]
