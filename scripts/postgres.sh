#!/usr/bin/env bash
# Start (or stop) a local PostgreSQL for the multi-worker tests; prints the URL to use.
# Usage: source scripts/postgres.sh start   ->  exports AUTOTUNE_TEST_POSTGRES
#        bash scripts/postgres.sh stop
#        source scripts/postgres.sh status   ->  the clusters, if any (changes nothing)
# Sourced: it leaves the caller's shell options as they were (no set -u, no set -e).
action=${1:-start}
if [ "$action" = status ]; then
  pg_lsclusters 2>/dev/null || echo "no PostgreSQL installed"
  return 0 2>/dev/null || exit 0
fi
if [ "$action" = stop ]; then
  pg_ctlcluster "$(ls /etc/postgresql | sort -V | tail -1)" main stop 2>/dev/null || true
  return 0 2>/dev/null || exit 0
fi
if ! command -v pg_ctlcluster >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
ver=$(ls /etc/postgresql | sort -V | tail -1)
pg_lsclusters | grep -q "^$ver *main" || pg_createcluster "$ver" main >/dev/null
pg_ctlcluster "$ver" main start 2>/dev/null || true
for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 && break; sleep 1; done
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='autotune'\"" | grep -q 1 ||
  su postgres -c "psql -qc \"CREATE ROLE autotune LOGIN PASSWORD 'autotune'\""
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='autotune'\"" | grep -q 1 ||
  su postgres -c "psql -qc 'CREATE DATABASE autotune OWNER autotune'"
export AUTOTUNE_TEST_POSTGRES=postgresql://autotune:autotune@127.0.0.1:5432/autotune
echo "PostgreSQL $ver up: $AUTOTUNE_TEST_POSTGRES"
