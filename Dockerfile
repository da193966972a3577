# nanomt serve on the CPU, from the pinned wheels (docs/serving.md, Docker).
#   docker build -t nanomt .
#   docker run --rm -p 127.0.0.1:8000:8000 -v "$PWD/runs/demo:/model:ro" nanomt
# The checkpoint (a run directory) is mounted at /model; arguments after the image name go to `nanomt serve`.

FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY constraints.txt ./
# torch's CPU wheel first, at the pinned version: the default index would bring the multi-GB CUDA build.
RUN pip install --no-cache-dir -c constraints.txt --index-url https://download.pytorch.org/whl/cpu torch
COPY pyproject.toml README.md ./
COPY nanomt ./nanomt
# files: /translate_file and nanomt translate --format take every format of docs/files.md (office files, EPUB, PDF).
RUN pip install --no-cache-dir -c constraints.txt ".[serve,files]"

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
RUN useradd --create-home --uid 10001 nanomt
USER nanomt
EXPOSE 8000
# Liveness, not readiness: /ready is a 503 while the queue is full, which is load, not a reason to restart.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"]
# SIGTERM: stop accepting, answer what came in, exit (give it the request timeout: docker stop -t 70).
STOPSIGNAL SIGTERM
# 0.0.0.0 inside the container, so that a published port reaches it; publish it on 127.0.0.1 unless the
# world should reach it, and set NANOMT_API_KEY when it should.
ENTRYPOINT ["nanomt", "serve", "/model", "--host", "0.0.0.0", "--port", "8000"]
