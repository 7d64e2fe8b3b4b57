# The TLT operator: kopf + the kubernetes client, no torch.
# Build from the repository root: docker build -f images/operator.Dockerfile -t tlt-operator .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tlt ./tlt
COPY operator ./operator
COPY components ./components
# The operator imports tlt.config / tlt.status only; --no-deps keeps torch, ray and
# transformers out, and the listed packages are what those modules and kopf need.
RUN pip install --no-deps . \
 && pip install "kopf>=1.37" "kubernetes>=30,<31" "pydantic>=2.7" "pyyaml>=6" "prometheus-client>=0.20" \
 && rm -rf /src

USER 10001:10001
WORKDIR /tmp
CMD ["tlt-operator"]
