# Junction's container image. Build it with `cargo xtask image`, which prepares the build
# context (target/image/context: the release binary with its BPF programs embedded, the default
# config) and the base image when it is missing, then runs
#   podman build --format docker -f Dockerfile --build-arg BASE=… target/image/context
#
# Why the binaries are built on the host and copied in: the BPF programs need nightly Rust,
# rust-src, LLVM 22 and bpf-linker, and the agent a current stable Rust; none of these is in
# Debian bookworm (its rustc is 1.63), and a Rust image from a public registry cannot be pulled
# where CI runs. `cargo xtask build-ebpf` and `cargo build --release` are the one build recipe,
# used for the tests, the benchmarks and this image alike. The host is Debian bookworm, as is
# the base, so the binary's glibc matches (the first stage proves it by running it).
#
# NVML is not in the image: the NVIDIA container runtime (runtimeClassName: nvidia, or
# `--device nvidia.com/gpu=all` with CDI) mounts the host driver's libnvidia-ml.so.1.
#
# Privileges: the agent starts as root with the capabilities the runtime grants, loads and
# attaches its BPF programs, opens /dev/kmsg and the GPUs, then drops every capability except
# CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE on every thread and sets no_new_privs
# (`drop_privileges = true`, the default). A non-root USER is not used: a non-root process only
# gets capabilities through file capabilities (exec fails outright where the runtime's bounding
# set lacks one, e.g. an unprivileged run that should still serve NVML) or ambient capabilities
# (which Kubernetes does not set for non-root containers), and reading /dev/kmsg, the state
# directory and other users' /proc entries would need the same capabilities anyway.

# The Debian base for both stages. CI uses a debootstrapped bookworm imported into podman.
ARG BASE=docker.io/library/debian:bookworm-slim

# Stage 1: the artifacts, checked on the base they will run on.
FROM ${BASE} AS artifacts
# Marks this stage's image, which the build leaves untagged, for `cargo xtask image` to remove.
LABEL io.junction.stage="artifacts"
COPY junction /out/usr/local/bin/junction
COPY junction.toml /out/etc/junction/junction.toml
# Runs on the base's glibc (validation of the config needs the host's devices: it runs at
# start-up, where a bad file fails with the key named).
RUN /out/usr/local/bin/junction --version

# Stage 2: the runtime: the binary, its config, FreeIPMI (the IPMI source runs ipmi-sensors)
# and CA certificates (Redfish and OTLP over TLS).
FROM ${BASE}
ARG VERSION=dev
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates freeipmi-tools \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && mkdir -p /var/lib/junction
COPY --from=artifacts /out/ /
LABEL org.opencontainers.image.title="junction" \
      org.opencontainers.image.description="GPU node telemetry agent: NVML, eBPF attribution, kernel-log XIDs, Redfish/IPMI cooling, health; OTLP and Prometheus" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.junction.privileges="privileged, or CAP_BPF CAP_PERFMON CAP_SYSLOG CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_DAC_READ_SEARCH; hostPID; see config/kubernetes/daemonset.yaml"
ENV JUNCTION_CONFIG=/etc/junction/junction.toml
VOLUME ["/var/lib/junction"]
EXPOSE 9474
# Unhealthy while a source is down (the answer names it); see /healthz in docs/CONFIG.md.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/junction", "healthcheck"]
# SIGTERM stops the sources, makes a last export and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/junction"]
CMD ["run"]
