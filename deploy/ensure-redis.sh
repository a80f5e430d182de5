#!/usr/bin/env bash
# Make sure a Redis server answers on 127.0.0.1:6379 (tests use a real one, never a fake).
set -euo pipefail
port="${VOXGATE_TEST_REDIS_PORT:-6379}"
ping() { redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; }
if command -v redis-cli >/dev/null && ping; then exit 0; fi
if ! command -v redis-server >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
fi
mkdir -p /var/lib/redis /var/log/redis
redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$port" --save "" --appendonly no \
  --dir /var/lib/redis --logfile /var/log/redis/ci.log
for _ in $(seq 50); do ping && exit 0; sleep 0.1; done
echo "redis did not start on port $port" >&2
exit 1
