#!/usr/bin/env bash
# Make sure a redis-server binary exists for the tests (they start their own on free ports).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then exit 0; fi
if [ -n "${REDIS_SERVER:-}" ] && [ -x "${REDIS_SERVER}" ]; then exit 0; fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "redis-server not found: installing Debian's redis-server package"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  # The package starts a system service on 6379; the tests never use it.
  command -v redis-server >/dev/null && exit 0
fi
echo "error: redis-server is required by the tests; install it (apt-get install redis-server) or set REDIS_SERVER=/path/to/redis-server" >&2
exit 1
