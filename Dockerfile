# specadvisor API image: multi-stage, non-root, repeatable (constraints.txt pins every dependency).
#   podman build -t specadvisor .          (or docker build)
#   podman run -p 8000:8000 -v specadvisor-data:/data specadvisor
# `advisor serve` migrates and seeds once, then starts gunicorn (advisor/gunicorn_conf.py: gthread workers, so
# slow clients do not hold whole workers). GPU calibration nodes use the `worker` target (vLLM, RQ worker).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Behind a TLS-intercepting proxy or with a private index: --build-arg PIP_CERT=/path (mounted with -v) or
# --build-arg PIP_INDEX_URL=...; unset, pip uses PyPI.
ARG PIP_CERT PIP_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# dependencies first, pinned: this layer is reused while only the code changes
COPY constraints.txt ./
RUN /opt/venv/bin/pip install -r constraints.txt
COPY pyproject.toml setup.cfg README.md ./
COPY advisor ./advisor
COPY calibration ./calibration
COPY benchmarks ./benchmarks
COPY migrations ./migrations
RUN /opt/venv/bin/pip install --no-deps . && /opt/venv/bin/pip check

FROM ${PYTHON_IMAGE} AS api
# Only the venv travels (no wheel files, no pip cache). Writable state lives in /data (SQLite, calibration logs)
# and in /dev/shm (metrics of the workers, matplotlib's cache), so a read-only root filesystem works.
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    SPECADVISOR_INSTANCE=/data SPECADVISOR_BIND=0.0.0.0:8000 \
    PROMETHEUS_MULTIPROC_DIR=/dev/shm/specadvisor-metrics MPLCONFIGDIR=/dev/shm/specadvisor-matplotlib
# uid 10001, group 0 and a group-writable /data: also runs under --user <any uid>:0 (OpenShift-style)
RUN useradd --uid 10001 --gid 0 --home-dir /data --no-create-home --shell /usr/sbin/nologin advisor \
    && mkdir -p /data && chown 10001:0 /data && chmod 2775 /data
COPY --from=build /opt/venv /opt/venv
USER 10001:0
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v1/health', timeout=4).status != 200)"
CMD ["advisor", "serve"]

# GPU calibration node: the same code plus vLLM; runs `advisor worker --hardware <GPU>` against REDIS_URL and
# DATABASE_URL (PostgreSQL shared with the API). Needs an NVIDIA GPU (compose: profile "gpu").
FROM api AS worker
USER root
COPY constraints.txt /tmp/constraints.txt
RUN /opt/venv/bin/pip install --no-cache-dir -c /tmp/constraints.txt "vllm>=0.33" && rm /tmp/constraints.txt
USER 10001:0
HEALTHCHECK NONE
CMD ["sh", "-c", "exec advisor worker --hardware \"${SPECADVISOR_HARDWARE:?set SPECADVISOR_HARDWARE to the GPU catalog name}\""]
