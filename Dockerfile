# specadvisor API image: multi-stage, non-root; migrates the database, then serves with gunicorn.
# GPU calibration nodes use their own image with `pip install .[calibration]` (vLLM) and `advisor worker`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY advisor ./advisor
COPY calibration ./calibration
COPY benchmarks ./benchmarks
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 SPECADVISOR_INSTANCE=/data
RUN useradd --create-home --uid 10001 advisor && mkdir /data && chown advisor /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY --chown=advisor wsgi.py ./
USER advisor
EXPOSE 8000
# Migrations (and catalog seeding) run once before the workers start; the workers then skip them.
CMD ["sh", "-c", "advisor migrate && advisor seed-catalog && SPECADVISOR_AUTO_MIGRATE=0 exec gunicorn --bind 0.0.0.0:8000 --workers 2 --access-logfile - 'advisor:create_app()'"]
