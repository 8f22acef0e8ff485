# pstrain in a container: Debian 12, the portable binary (x86-64-v3 with runtime ISA dispatch:
# one image for every AVX2 machine), the shipped configs. docs/DEPLOY.md shows how SageMaker,
# Kubernetes and mpirun launch it.
#
#   docker build -t pstrain .           (or podman build)
#   docker run --rm pstrain --version
#
# Stage 1 builds with the project's own scripts (Debian packages only); stage 2 holds the
# runtime libraries and what `cmake --install` put under /opt/pstrain.

FROM debian:12 AS build
WORKDIR /src
COPY scripts/install_deps.sh scripts/install_deps.sh
RUN bash scripts/install_deps.sh && apt-get install -y -qq --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*
COPY . .
# The version comes from git when .git was copied, else from this build argument.
ARG PSTRAIN_VERSION=""
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DPSTRAIN_FALLBACK_VERSION="${PSTRAIN_VERSION}" \
    && cmake --build build -j"$(nproc)" --target pstrain \
    && cmake --install build --prefix /opt/pstrain

FROM debian:12
# The runtime packages of the shared libraries the binary links (`ldd pstrain` mapped to Debian
# packages with dpkg -S; OpenCL's loader is oneDNN's dependency), plus mpirun for `allreduce`.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        libabsl20220623 libc-ares2 libcivetweb1 libdnnl2 libevent-core-2.1-7 \
        libevent-pthreads-2.1-7 libgomp1 libgrpc++1.51 libgrpc29 libhwloc15 libopenmpi3 \
        libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprotobuf32 libre2-9 libssl3 \
        libstdc++6 libudev1 ocl-icd-libopencl1 zlib1g openmpi-bin \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/pstrain /opt/pstrain
ENV PATH=/opt/pstrain/bin:$PATH
# SageMaker runs `<image> train`: that is `pstrain train` here (one instance). Multi-instance
# jobs set the container entry point to ["pstrain", "host"] (docs/DEPLOY.md).
ENTRYPOINT ["pstrain"]
CMD ["--help"]
