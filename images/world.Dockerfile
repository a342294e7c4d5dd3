# The Gaia2 world sidecar: labkube plus Meta's ARE 1.2.0 in a virtualenv of its own (ARE's pinned
# dependencies conflict with labkube's). Set the chart's runs.world.image to it.
#   docker build -f images/world.Dockerfile --build-arg LABKUBE_IMAGE=ghcr.io/labkube/labkube:0.1.0 \
#     -t ghcr.io/labkube/world:0.1.0 .
ARG LABKUBE_IMAGE=ghcr.io/labkube/labkube:0.1.0
FROM ${LABKUBE_IMAGE}

USER 0
ENV LABKUBE_ARE_VENV=/opt/are
RUN labkube worlds setup
USER 1000

# Listens on 127.0.0.1:$LABKUBE_WORLD_PORT (the pod manifest sets it); the agent is in the same pod.
ENTRYPOINT ["labkube", "worlds", "serve"]
