# chargeguard sidecar image. Multi-stage: the builder compiles only the `chargeguard` executable; the runtime
# stage is the same Debian base plus Debian's ca-certificates (OpenSSL's default trust store, which verifies
# api.stripe.com when no --stripe-ca-file is given), exactly the shared libraries that executable links (ldd),
# a non-root user, and chargeguard as PID 1 (it handles SIGTERM: RDY 0, drain, CLS, exit 0).
#
#   podman build --format docker --build-arg REVISION="$(git rev-parse HEAD)" -t chargeguard .
#   docker build --build-arg REVISION="$(git rev-parse HEAD)" -t chargeguard .   # (--format docker keeps HEALTHCHECK)
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#                --build-arg SOURCE=https://<where the repository lives> -t chargeguard:0.1.0 .
#
# BASE is a build argument: a release pulls the Debian image pinned by digest below (refresh the digest
# deliberately, e.g. when Debian publishes a point release: `docker buildx imagetools inspect
# debian:bookworm-slim`); where no registry is reachable the same file builds on a local base image
# (tests/container/run.sh passes --build-arg BASE=localhost/debian:bookworm-slim, a debootstrapped import).
#
# Configuration comes only from the environment (every flag has a CHARGEGUARD_<FLAG> variable; libpq reads
# PG* variables, PGPASSFILE included) and secret files. Nothing secret is baked into the image. The Stripe
# key, first match wins: CHARGEGUARD_STRIPE_KEY_FILE (or --stripe-key-file) naming a file; else
# STRIPE_API_KEY; else /run/secrets/stripe_api_key if it exists (where `docker run --secret` and a
# Kubernetes secret volume put it). The image presets none of these, so each form works as documented
# (docs/operating/deployment.md).
ARG BASE=debian:bookworm-slim@sha256:3783cc01769c7b2b1b83a5c5ad96c815348e28ed7da68e2e3687004faa906251
# OCI labels (org.opencontainers.image.*): the release passes its version, the commit and the repository URL.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
# One stage graph that podman (buildah) and docker both accept: the builder is a named stage the runtime
# stage copies from; no stage name is computed from a build argument (podman 4.3 resolves
# `FROM build-${ARG}` as an image name, not as a stage).
FROM ${BASE} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      meson ninja-build g++ pkg-config python3 libasio-dev libssl-dev libpq-dev libsimdjson-dev \
      libcrypt-dev libhttp-parser-dev libcli11-dev prometheus-cpp-dev libsnappy-dev zlib1g-dev ccache \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY meson.build meson_options.txt ./
COPY src ./src
COPY migrations ./migrations
# Only the executable, configured without the tests (-Dtests=false: no tests/, no lab, no Boost.Test; a
# change to a test leaves this stage's layers cached), at -O2 (what CI's normal tree tests; -O3 would only
# lengthen the compile of a sidecar that waits on the network), as a unity build (each library's sources
# one translation unit: the headers of Asio and libstdc++ parsed once per library, not once per file).
# CCACHE_DIR may be a volume the builder mounts (`podman build -v DIR:/ccache …`), so a rebuild of unchanged
# sources is quick; without one ccache just compiles. The context has no .git: the revision reaches the
# binary (`chargeguard version`, chargeguard_build_info{revision}) through CHARGEGUARD_REVISION, which
# src/app/meson.build reads.
# The runtime gets the libraries the base lacks: everything ldd lists but libc, libstdc++, libgcc and
# OpenSSL (the runtime stage installs libssl3 with ca-certificates, from the same Debian release).
ARG CCACHE_DIR=/ccache
ENV CCACHE_DIR=${CCACHE_DIR}
ARG REVISION
RUN meson setup /build -Dbuildtype=release -Doptimization=2 -Dtests=false -Dunity=on -Dunity_size=1000 \
 && CHARGEGUARD_REVISION="${REVISION}" ninja -C /build src/app/chargeguard \
 && strip /build/src/app/chargeguard \
 && mkdir -p /out/usr/local/bin /out/usr/lib \
 && cp /build/src/app/chargeguard /out/usr/local/bin/ \
 && ldd /build/src/app/chargeguard | awk '/=> \// {print $3}' \
    | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*|libssl|libcrypto)\.so' \
    | xargs -I{} cp -L {} /out/usr/lib/ \
 && /build/src/app/chargeguard version \
 && /build/src/app/chargeguard version | grep -qF "(revision ${REVISION}, "

FROM ${BASE}
# ca-certificates first, before any build argument is in scope, so its layer stays cached across releases:
# /etc/ssl/certs/ca-certificates.crt and the hashed /etc/ssl/certs directory are OpenSSL's default verify
# paths. Package lists are removed in the same layer.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt/* /var/log/dpkg.log /usr/share/doc/* /usr/share/man/* \
 && test -s /etc/ssl/certs/ca-certificates.crt
ARG VERSION
ARG REVISION
ARG SOURCE
LABEL org.opencontainers.image.title="chargeguard" \
      org.opencontainers.image.description="NSQ billing events charged on Stripe exactly once (sidecar)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /
RUN ldconfig \
 && echo 'chargeguard:x:10001:10001:chargeguard sidecar:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'chargeguard:x:10001:' >> /etc/group \
 && rm -rf /usr/share/doc/* /usr/share/man/* /var/cache/apt/* /var/lib/apt/lists/* \
 && chargeguard version
USER 10001:10001
ENV CHARGEGUARD_HEALTH_LISTEN=0.0.0.0:9180 \
    CHARGEGUARD_LOG_LEVEL=info
EXPOSE 9180
# No curl in the image: chargeguard probes itself. /healthz fails when the event loop lags. A bare path asks
# the listener CHARGEGUARD_HEALTH_LISTEN names (0.0.0.0 asked on 127.0.0.1), so a container run with
# another listener stays healthy without a --health-cmd of its own; over https when
# CHARGEGUARD_HEALTH_TLS_CERT_FILE is set (then CHARGEGUARD_HEALTH_CA_FILE names the CA that signed it).
# /healthz never asks for credentials, with --health-basic-auth-file or without.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["/usr/local/bin/chargeguard", "probe", "--timeout", "2", "/healthz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/chargeguard"]
CMD ["consume"]
