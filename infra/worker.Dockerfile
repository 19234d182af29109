# Image of the gpucampaign worker (and of the one-shot `setup` service) in infra/compose.yaml.
# UNTESTED here: the development machine has no Docker. Build from the repo root:
#   docker build -f infra/worker.Dockerfile -t gpucampaign-worker .
FROM python:3.11-slim

WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    DO_NOT_TRACK=1 \
    GPUCAMPAIGN_ROOT=/app

# torch first and pinned, as in the Makefile; from PyPI on x86_64 Linux this is a CUDA build.
ARG TORCH_SPEC=torch==2.13.0
RUN pip install "$TORCH_SPEC"

COPY pyproject.toml README.md ./
COPY src ./src
# With the tracking extra: a campaign whose spec (or MLFLOW_TRACKING_URI) names an MLflow
# server is tracked from the worker.
RUN pip install -e ".[tracking]"

# src/ holds the Prefect layer too (gpucampaign_prefect: flows, tasks, orchestration and the
# deployments' prefect.yaml); the pull step sets the working directory to $GPUCAMPAIGN_ROOT.
COPY infra ./infra
COPY examples ./examples
