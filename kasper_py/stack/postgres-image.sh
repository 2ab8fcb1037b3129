#!/bin/sh
# Entry point of kasper_py's locally built PostgreSQL image (kasper_py/stack/_images.py).
# `postgres [options]`: a cluster made in $PGDATA at first start (superuser postgres,
# trust authentication, as POSTGRES_HOST_AUTH_METHOD=trust in the official image), then
# the server, run as the postgres user; any other command runs as given.
set -e
if [ "$1" != postgres ]; then
  exec "$@"
fi
shift
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_postgres="setpriv --reuid=postgres --regid=postgres --init-groups --"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
  $as_postgres "$bin/initdb" -D "$PGDATA" -U postgres --auth=trust --encoding=UTF8 \
    --locale=C.UTF-8 >/dev/null
fi
mkdir -p /var/run/postgresql && chown postgres:postgres /var/run/postgresql
exec $as_postgres "$bin/postgres" -D "$PGDATA" "$@"
