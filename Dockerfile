# The Jetstream broker image used by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md ./
COPY jetstream ./jetstream
RUN pip install --no-cache-dir .
VOLUME ["/data"]
ENTRYPOINT ["jetstream"]
# Loopback unless told otherwise: off loopback a broker needs TLS and a Raft password
# (see docker-compose.yml and README "Security").
CMD ["server", "--data-dir", "/data"]
