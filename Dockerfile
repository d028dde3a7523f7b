# Junction: multi-stage build. The BPF object is built with nightly + bpf-linker (LLVM 22), the
# agent with stable Rust; the runtime image carries only the binary. NVML comes from the host
# (the NVIDIA container runtime mounts libnvidia-ml.so.1); run privileged for eBPF and /dev/kmsg.
# The same steps run through `cargo xtask build-ebpf` and `cargo build --release` in CI.

FROM rust:1.95-bookworm AS build
# Not finished: `cargo xtask build-ebpf` installs LLVM 22 with apt-get; whether this base image's
# apt sources carry it is unchecked (the deployment work settles the LLVM source).
RUN rustup toolchain install nightly --component rust-src
WORKDIR /src
COPY . .
RUN cargo xtask build-ebpf && cargo build --release --locked -p junction

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/junction /usr/local/bin/junction
COPY --from=build /src/config/junction.toml /etc/junction/junction.toml
EXPOSE 9474
ENTRYPOINT ["/usr/local/bin/junction", "--config", "/etc/junction/junction.toml"]
CMD ["run"]
