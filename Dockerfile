# chargeguard sidecar image. Multi-stage: the builder compiles only the `chargeguard` executable; the runtime
# stage is the same Debian base plus exactly the shared libraries that executable links (ldd), a non-root
# user, and chargeguard as PID 1 (it handles SIGTERM: RDY 0, drain, CLS, exit 0).
#
#   podman build --format docker -t chargeguard .          # --format docker keeps HEALTHCHECK
#   docker build -t chargeguard .
# BASE is a build argument so the same file builds where only a local base image exists
# (tests/container/run.sh passes --build-arg BASE=localhost/debian:bookworm-slim).
#
# Configuration comes only from the environment (every flag has a CHARGEGUARD_<FLAG> variable; libpq reads
# PG* variables, PGPASSFILE included) and secret files (CHARGEGUARD_STRIPE_KEY_FILE defaults to
# /run/secrets/stripe_api_key). Nothing secret is baked into the image.
ARG BASE=debian:bookworm-slim
# BUILD=source (the default, what a release uses) compiles chargeguard in the builder stage below.
# BUILD=context takes an already built, stripped executable and the shared libraries it needs from the build
# context's prebuilt/ folder (prebuilt/usr/local/bin/chargeguard, prebuilt/usr/lib/*.so*), built on the same
# Debian release: tests/container/run.sh uses it in CI, where the in-image compile alone would take ~12
# minutes on 2 cores. The runtime stage is the same either way; podman/buildah skips the unused builder.
ARG BUILD=source

FROM ${BASE} AS build-source
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      meson ninja-build g++ pkg-config python3 libasio-dev libssl-dev libpq-dev libsimdjson-dev \
      libboost-test-dev libhttp-parser-dev libcli11-dev prometheus-cpp-dev ccache \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY meson.build meson_options.txt ./
COPY src ./src
COPY migrations ./migrations
COPY tests ./tests
COPY ci ./ci
# Only the executable (no tests). CCACHE_DIR may be a volume the builder mounts (`podman build -v …`), so a
# rebuild of unchanged sources is quick; without one ccache just compiles.
# The runtime gets the libraries the base lacks: everything ldd lists but libc, libstdc++ and libgcc.
ARG CCACHE_DIR=/ccache
ENV CCACHE_DIR=${CCACHE_DIR}
RUN meson setup /build -Dbuildtype=release \
 && ninja -C /build src/app/chargeguard \
 && strip /build/src/app/chargeguard \
 && mkdir -p /out/usr/local/bin /out/usr/lib \
 && cp /build/src/app/chargeguard /out/usr/local/bin/ \
 && ldd /build/src/app/chargeguard | awk '/=> \// {print $3}' \
    | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
    | xargs -I{} cp -L {} /out/usr/lib/ \
 && /build/src/app/chargeguard version

FROM scratch AS build-context
COPY prebuilt/ /out/

FROM build-${BUILD} AS build

FROM ${BASE}
COPY --from=build /out/ /
RUN ldconfig \
 && echo 'chargeguard:x:10001:10001:chargeguard sidecar:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'chargeguard:x:10001:' >> /etc/group \
 && rm -rf /usr/share/doc/* /usr/share/man/* /var/cache/apt/* /var/lib/apt/lists/* \
 && chargeguard version
USER 10001:10001
ENV CHARGEGUARD_HEALTH_LISTEN=0.0.0.0:9180 \
    CHARGEGUARD_STRIPE_KEY_FILE=/run/secrets/stripe_api_key \
    CHARGEGUARD_LOG_LEVEL=info
EXPOSE 9180
# No curl in the image: chargeguard probes itself. /healthz fails when the event loop lags.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["/usr/local/bin/chargeguard", "probe", "--timeout", "2", "http://127.0.0.1:9180/healthz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/chargeguard"]
CMD ["consume"]
