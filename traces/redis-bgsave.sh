#!/bin/sh
# redis-server with a ~100 MB dataset saves it in the background (BGSAVE: a fork whose child
# writes the snapshot while the parent keeps serving writes, each write to a page the child
# still shares being a copy-on-write fault), then shuts down. Recorded for traces/ with
#   usermm record --thp 2M=always --out traces/redis-bgsave-2m.umt -- sh traces/redis-bgsave.sh
# (and 64K=always); needs redis-server, redis-cli and redis-benchmark (Debian: redis).
set -e
D=$(mktemp -d /tmp/usermm-redis.XXXXXX)
PORT=${PORT:-6399}
redis-server --port "$PORT" --save '' --appendonly no --dir "$D" --logfile "$D/log" &
P=$!
until redis-cli -p "$PORT" ping >/dev/null 2>&1; do sleep 0.05; done
redis-benchmark -p "$PORT" -q -t set -n 80000 -r 80000 -d 1000 -P 32 >/dev/null
redis-cli -p "$PORT" bgsave >/dev/null
redis-benchmark -p "$PORT" -q -t set -n 40000 -r 80000 -d 1000 -P 32 >/dev/null
while redis-cli -p "$PORT" info persistence | grep -q 'rdb_bgsave_in_progress:1'; do sleep 0.1; done
redis-cli -p "$PORT" shutdown nosave >/dev/null
wait "$P"
rm -rf "$D"
