FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sessionflow ./sessionflow
COPY workflows ./workflows
COPY activities ./activities
COPY store ./store
COPY worker.py ./
RUN pip install --no-cache-dir .
CMD ["python", "worker.py"]
