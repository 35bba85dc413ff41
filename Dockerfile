# syntax=docker/dockerfile:1
# capbroker: the broker as a static binary on a minimal image, running as a non-root user.
#
#   docker build -t capbroker .                      the broker (the last stage is the default)
#   docker build --build-arg VERSION=$(git describe --tags --always) \
#     --build-arg COMMIT=$(git rev-parse HEAD) -t capbroker .     with the build's version
#   docker run --rm capbroker version                 capbroker <version> (commit ..., go ...)
#   docker run -v $PWD/broker.yaml:/etc/broker/broker.yaml:ro ... capbroker   runs `broker run`
#
# docker-compose.yml also builds the demo stages: ca-init, demo-upstream and demo-agent.

ARG GO_VERSION=1.26

# --- build: the broker, statically linked (no cgo, no libc at run time) ---------------------
FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=""
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/broker ./cmd/broker \
 && mkdir -p /out/state

# --- demo: the compose demo's API (not part of the broker image) ----------------------------
FROM build AS build-demo
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w" -o /out/demo-upstream ./deploy/demo-upstream \
 && mkdir -p /out/pki

# One-shot job: `broker ca init` when no CA exists yet, then publish ca.crt (not the key).
FROM busybox:1.37 AS ca-init
COPY --from=build /out/broker /usr/local/bin/broker
COPY --chmod=0755 deploy/broker/ca-init.sh /usr/local/bin/ca-init
RUN mkdir -p /ca /ca-public /admin && chown 65532:65532 /ca /ca-public /admin && chmod 0700 /ca /admin
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ca-init"]

# The demo API: HTTPS with its own CA, echoes what it received.
FROM gcr.io/distroless/static-debian12:nonroot AS demo-upstream
COPY --from=build-demo /out/demo-upstream /demo-upstream
COPY --from=build-demo --chown=65532:65532 /out/pki /pki
USER 65532:65532
ENTRYPOINT ["/demo-upstream"]

# The demo agent: an ordinary Debian with curl and python3, and no CA bundle but the broker's.
FROM debian:bookworm-slim AS demo-agent
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl python3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --create-home --shell /bin/sh agent
USER 10001:10001
WORKDIR /home/agent
CMD ["sleep", "infinity"]

# The Kubernetes init container of transparent mode (deploy/kubernetes/transparent/pod.yaml):
# the broker beside nft, for `broker transparent rules --hook output --apply`.
FROM alpine:3.20 AS rules-init
RUN apk add --no-cache nftables
COPY --from=build /out/broker /usr/local/bin/broker
ENTRYPOINT ["/usr/local/bin/broker"]

# --- the broker image: one static binary on distroless, user nonroot (65532) ----------------
FROM gcr.io/distroless/static-debian12:nonroot AS broker
COPY --from=build /out/broker /broker
COPY policies /etc/broker/policies
# Where approvals.state_file goes (/etc/broker is read-only to the broker): a volume mounted
# here starts out owned by the broker's user.
COPY --from=build --chown=65532:65532 --chmod=0700 /out/state/ /var/lib/capbroker/
USER 65532:65532
EXPOSE 8080
# No shell in the image: the broker checks itself. `broker healthcheck` GETs the admin
# /readyz (default 127.0.0.1:9090; pass --admin when admin.listen is elsewhere) and exits 0/1.
# /readyz is 503 only while no policy is loaded (docs/operations.md).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["/broker", "healthcheck"]
ENTRYPOINT ["/broker"]
CMD ["run", "--config", "/etc/broker/broker.yaml"]
