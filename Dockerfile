# kube-iam-broker: the per-node agent image. Build with scripts/build-image.sh (or docker build .).
# The build stage runs scripts/build-image.sh --rootfs, the same recipe CI runs without a
# container engine, so what this file builds is what the tests exercised.

FROM node:24-bookworm-slim AS build
WORKDIR /src
COPY . .
RUN bash scripts/build-image.sh --rootfs /staging

FROM node:24-bookworm-slim
# iptables and conntrack: the DNAT rule that sends pods' 169.254.169.254 traffic to the agent, and
# the reset of connections opened before that rule existed. tini: a PID 1 that forwards SIGTERM to
# node (which then drains and removes its rule) and reaps the iptables and conntrack children.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables conntrack tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /staging/app /app
WORKDIR /app
ENV NODE_ENV=production
# Root, on purpose: iptables and conntrack need CAP_NET_ADMIN when they run, and Kubernetes cannot
# give a non-root process ambient capabilities; file capabilities on the binaries are ignored under
# allowPrivilegeEscalation: false. The DaemonSet drops every other capability and makes the root
# filesystem read-only instead.
USER root
ENTRYPOINT ["/usr/bin/tini", "--", "node", "/app/dist/cli.js"]
