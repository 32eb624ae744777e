# The forestflow gateway: Python 3.11 and a Java 17 runtime (H2O MOJOs are scored in an in-process JVM).
# bookworm pinned: it is the Debian release of python:3.11-slim that still ships openjdk-17.

# The C extensions (setup.py) are compiled here; the image itself carries no compiler.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY forestflow ./forestflow
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY --from=build /wheels /wheels
# Every extra by default (the image carries Java for genmodel); FORESTFLOW_EXTRAS= builds the lean core only.
ARG FORESTFLOW_EXTRAS=all
RUN pip install --no-cache-dir "$(ls /wheels/*.whl)${FORESTFLOW_EXTRAS:+[$FORESTFLOW_EXTRAS]}" && rm -rf /wheels
COPY servables ./servables
COPY config ./config

RUN useradd --system --uid 10001 --home-dir /app forestflow \
 && mkdir -p /data && chown forestflow /data
USER forestflow

# Bind every interface inside the container (an admin token is then required: FORESTFLOW_ADMIN_TOKEN).
ENV FORESTFLOW_HOST=0.0.0.0 \
    FORESTFLOW_DATA_DIR=/data \
    PYTHONUNBUFFERED=1
VOLUME ["/data"]
EXPOSE 8090 8081

HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=5 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8090/health/ready', timeout=2)"

CMD ["forestflow", "serve"]
