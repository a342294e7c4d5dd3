# The labkube image: the operator, and run pods' `prepare` and `agent` containers (bundled tasks included).
#   docker build -f images/labkube.Dockerfile -t ghcr.io/labkube/labkube:0.1.0 .
FROM python:3.11-slim

# git: the agent's workspace is a git repository (snapshots, the grader's pristine view).
# nodejs, npm: Claude Code and Codex CLI (--agent claude-code / codex), installed below at their pinned versions.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git nodejs npm \
 && rm -rf /var/lib/apt/lists/*

COPY . /src
RUN pip install --no-cache-dir /src && rm -rf /src

# The CLIs in the image, where `labkube agent` looks for them: run pods never install from npm.
ENV LABKUBE_CLI_CACHE=/opt/labkube/cli-agents
RUN labkube agents install && npm cache clean --force

# Run pods use a read-only root file system, HOME=/tmp and this uid.
RUN useradd --uid 1000 --create-home labkube
USER 1000
ENTRYPOINT ["labkube"]
CMD ["--help"]
