# The autoresearch service: webhook server + conductor (`autoresearch serve`).
#
#   docker build -t autoresearch-bot .                               # the server alone, no torch:
#                                                                    #   set AUTORESEARCH_RUNNER=actions
#   docker build --build-arg EXTRAS=modal -t autoresearch-bot .      # ... or runs on Modal (runner=modal)
#   docker build --build-arg EXTRAS=train -t autoresearch-bot .      # also trains here (runner=local)
#
# The image sets no runner: AUTORESEARCH_RUNNER is local unless .env says otherwise, and an image
# without the training stack stops at start saying which runner to choose (bot/app/settings.py), rather
# than serving webhooks while its conductor cannot run.
#
# The App's private key is a file mounted read-only, never an environment variable (`docker
# inspect` shows those to anyone who can reach the Docker daemon). The bot runs as uid 10001, so
# the file must be readable by that uid:
#   sudo install -d -m 0755 /etc/autoresearch
#   sudo install -m 0400 -o 10001 autoresearch.private-key.pem /etc/autoresearch/app.pem
#   docker run --env-file .env -p 8080:8080 -v autoresearch-state:/state \
#     -v /etc/autoresearch/app.pem:/run/secrets/app.pem:ro \
#     -e AUTORESEARCH_GITHUB_PRIVATE_KEY_PATH=/run/secrets/app.pem autoresearch-bot
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
# /healthz answers 503 once the conductor stopped (bot/app/serve.py), so "unhealthy" means it acts on nothing
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('AUTORESEARCH_PORT', '8080'), timeout=4)" || exit 1
CMD ["autoresearch", "serve"]
