# GPU worker image: NVIDIA's TensorRT container (TensorRT + its Python bindings, CUDA, cuDNN) with
# route-tuner installed. Pick the NGC release whose CUDA your driver supports:
#   docker build --build-arg TENSORRT_TAG=25.10 -t route-tuner-gpu .
ARG TENSORRT_TAG=25.10
FROM nvcr.io/nvidia/tensorrt:${TENSORRT_TAG}-py3

# The image's system Python carries TensorRT's bindings: install beside them (no venv hides them).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /opt/route-tuner
COPY pyproject.toml setup.py README.md ./
COPY tuner ./tuner
COPY migrations ./migrations
# Versions are pinned by pyproject.toml (the project plus its "tensorrt" extra).
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir ".[tensorrt]" \
 && python3 -c "import tensorrt, tuner.cli.main; print('tensorrt', tensorrt.__version__)"

# Unprivileged by default; compose runs it as the host user (TUNER_UID) so bind-mounted study folders stay writable.
RUN useradd --system --uid 10001 --create-home --shell /usr/sbin/nologin tuner
USER 10001
WORKDIR /work
ENTRYPOINT ["tuner"]
CMD ["--help"]
