# The Jetstream broker image used by docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md ./
COPY jetstream ./jetstream
RUN pip install --no-cache-dir .
VOLUME ["/data"]
ENTRYPOINT ["jetstream"]
CMD ["server", "--data-dir", "/data", "--host", "0.0.0.0"]
