# The autoresearch service: webhook server + conductor (`autoresearch serve`).
#   docker build -t autoresearch-bot .                       # the server alone, no torch
#   docker build --build-arg EXTRAS=train -t autoresearch-bot .   # also runs training here (runner=local)
#   docker run --env-file .env -p 8080:8080 -v autoresearch-state:/state autoresearch-bot
FROM python:3.11-slim

ARG EXTRAS=""
RUN apt-get update && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md train.py program.md ./
COPY bot ./bot
COPY runner ./runner
RUN if [ -n "$EXTRAS" ]; then pip install --no-cache-dir ".[$EXTRAS]"; else pip install --no-cache-dir .; fi

RUN useradd --create-home --uid 10001 autoresearch && mkdir /state && chown autoresearch /state
USER autoresearch
ENV AUTORESEARCH_STATE_DIR=/state AUTORESEARCH_HOST=0.0.0.0 AUTORESEARCH_PORT=8080
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)" || exit 1
CMD ["autoresearch", "serve"]
