"""The shell scripts the Database's containers run, all on the official postgres image.

They are plain strings so that the tests can run them against real PostgreSQL servers
(``tests/databases/test_scripts.py``) exactly as the pods would. Connection settings come in
through libpq's own variables (``PGHOST``, ``PGPORT``, ``PGUSER``, ``PGPASSWORD``); passwords
are never on a command line, and never printed.
"""

from __future__ import annotations

BACKUP_DIR = "/backups"
PGDATA = "/var/lib/postgresql/data/pgdata"

# Shared by the Jobs: wait until a server accepts connections (the Job's own deadline bounds
# the whole run; this only keeps the first attempt from failing while the server starts).
_WAIT = r"""
wait_for() {
  for _ in $(seq 1 "${WAIT_TRIES:-120}"); do
    pg_isready -q -h "$1" && return 0
    sleep "${WAIT_SECONDS:-5}"
  done
  echo "the server at $1:${PGPORT} does not accept connections" >&2
  return 1
}
"""

# The init Job: the application role (owner of the application database) and the
# replication role, each created if missing and given the password of the credentials
# Secret; the application database created if missing. Every statement is idempotent, so a
# rerun (a retried pod) changes nothing that is already right.
INIT = r"""set -euo pipefail
""" + _WAIT + r"""
wait_for "$PGHOST"
psql -v ON_ERROR_STOP=1 --no-psqlrc -q -d postgres \
  -v app_user="$APP_USER" -v app_password="$APP_PASSWORD" -v app_db="$APP_DB" \
  -v replication_password="$REPLICATION_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN', :'app_user')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'app_user') \gexec
SELECT format('ALTER ROLE %I WITH LOGIN NOSUPERUSER PASSWORD %L',
              :'app_user', :'app_password') \gexec
SELECT 'CREATE ROLE replicator REPLICATION LOGIN'
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'replicator') \gexec
SELECT format('ALTER ROLE replicator WITH REPLICATION LOGIN PASSWORD %L',
              :'replication_password') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'app_db', :'app_user')
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'app_db') \gexec
SELECT format('ALTER DATABASE %I OWNER TO %I', :'app_db', :'app_user') \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', :'app_db') \gexec
SQL
echo "initialized: role $APP_USER owns database $APP_DB; replication role ready"
"""

# Backups (the CronJob's, the one before an upgrade, the final one): every role (without
# its password) and every database into the backup volume, written under a temporary name
# and renamed only once complete, so a failed run never looks like a backup and never evicts
# a good one. Only scheduled backups are pruned to the newest $RETENTION; those taken before
# an upgrade or before deletion are kept until someone deletes them. Restore one into a
# server (a new Database, or this one):
#   gunzip -c <file>.sql.gz | psql -d postgres
# No role password is in it (pg_dumpall's would have replaced the new server's, which its
# Secret holds, and broken its init, backup and standby logins; a role the server lacks is
# made without one), roles are not dropped (the restore's own user is one of them), and
# each database is dropped and made again with its data (pg_dump --create --clean).
BACKUP = r"""set -euo pipefail
""" + _WAIT + r"""
dir="${BACKUP_DIR:-/backups}"
wait_for "$PGHOST"
find "$dir" -maxdepth 1 -name '*.partial' -mmin +1440 -delete
file="$dir/$(date -u +%Y%m%dT%H%M%SZ)-$BACKUP_KIND.sql.gz"
dump() {
  pg_dumpall --globals-only --no-role-passwords || exit 1
  echo '\connect postgres'
  pg_dump --clean --if-exists -d postgres || exit 1
  dbs=$(psql -d postgres -Atc "SELECT datname FROM pg_database WHERE datallowconn
        AND NOT datistemplate AND datname <> 'postgres' ORDER BY datname") || exit 1
  while IFS= read -r db; do
    [ -z "$db" ] || pg_dump --create --clean --if-exists -d "$db" || exit 1
  done <<< "$dbs"
}
if ! dump | gzip > "$file.partial"; then
  rm -f "$file.partial"
  echo "backup failed: nothing written, earlier backups kept" >&2
  exit 1
fi
mv "$file.partial" "$file"
if [ "$BACKUP_KIND" = scheduled ]; then
  find "$dir" -maxdepth 1 -name '*-scheduled.sql.gz' | sort -r \
    | tail -n "+$((RETENTION + 1))" | xargs -r rm -f --
fi
echo "backup written: $file ($(du -h "$file" | cut -f1));" \
  "$(find "$dir" -maxdepth 1 -name '*-scheduled.sql.gz' | wc -l) scheduled backup(s) kept"
"""

# A standby (every pod but the first) starts from a copy of the primary: pg_basebackup with
# the replication role, writing the standby configuration (-R), into an empty data
# directory. A pod with data already starts as it is. Until the primary is up and the init
# Job has made the replication role, it retries.
STANDBY = r"""set -eu
ordinal="${HOSTNAME##*-}"
if [ "$ordinal" = 0 ] || [ -s "$PGDATA/PG_VERSION" ]; then
  exit 0
fi
rm -rf "$PGDATA" "$PGDATA.partial"
until pg_basebackup -h "$PRIMARY_HOST" -U replicator -D "$PGDATA.partial" -R -X stream \
    --checkpoint=fast --no-password; do
  rm -rf "$PGDATA.partial"
  echo "waiting for the primary $PRIMARY_HOST to serve a base backup"
  sleep 5
done
mv "$PGDATA.partial" "$PGDATA"
echo "standby data copied from $PRIMARY_HOST"
"""

# A major upgrade: the new major's server runs beside the old one (its own StatefulSet and
# volumes); this Job, on the new image (whose pg_dump reads every older server), makes the
# old server read-only, ends its sessions, and copies roles, then every database, into the
# new one (emptied first of what a failed attempt left). The handler switches the client
# Service only after this succeeded; on failure the old server accepts writes again and keeps
# serving.
UPGRADE = r"""set -euo pipefail
""" + _WAIT + r"""
old() { PGOPTIONS="-c default_transaction_read_only=off" psql -h "$OLD_HOST" -d postgres \
          --no-psqlrc -v ON_ERROR_STOP=1 -q "$@"; }
wait_for "$OLD_HOST"
wait_for "$NEW_HOST"
writable_again() {
  if [ "$1" -ne 0 ]; then
    echo "upgrade failed: $OLD_HOST accepts writes again" >&2
    old -c "ALTER SYSTEM RESET default_transaction_read_only" -c "SELECT pg_reload_conf()" \
      > /dev/null || true
  fi
}
trap 'writable_again $?' EXIT
# The new server holds nothing but what an earlier attempt copied (the handler starts it for
# this copy and points nothing at it before the copy succeeded): a retry, the failed Job
# deleted, starts from an empty server again instead of stopping on "already exists".
new() { psql -h "$NEW_HOST" -d template1 --no-psqlrc -v ON_ERROR_STOP=1 -q "$@"; }
new -At -c "SELECT quote_ident(datname) FROM pg_database WHERE NOT datistemplate" \
  > /tmp/stale-databases
while IFS= read -r db; do new -c "DROP DATABASE $db WITH (FORCE)"; done < /tmp/stale-databases
new -c "CREATE DATABASE postgres"
new -At -c "SELECT quote_ident(rolname) FROM pg_roles
            WHERE rolname <> current_user AND rolname !~ '^pg_'" > /tmp/stale-roles
while IFS= read -r role; do
  new -c "DROP OWNED BY $role CASCADE" -c "DROP ROLE $role"
done < /tmp/stale-roles
old -c "ALTER SYSTEM SET default_transaction_read_only = on" -c "SELECT pg_reload_conf()" \
  > /dev/null
old -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'" > /dev/null
pg_dumpall -h "$OLD_HOST" --globals-only \
  | sed -e "/^CREATE ROLE $PGUSER;\$/d" \
  | psql -h "$NEW_HOST" -d postgres --no-psqlrc -v ON_ERROR_STOP=1 -q
old -At -c "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate
            ORDER BY datname" > /tmp/databases
while IFS= read -r db; do
  if [ "$db" = postgres ]; then
    pg_dump -h "$OLD_HOST" -Fc -d postgres \
      | pg_restore -h "$NEW_HOST" -d postgres --exit-on-error
  else
    pg_dump -h "$OLD_HOST" -Fc -d "$db" \
      | pg_restore -h "$NEW_HOST" -d postgres --create --exit-on-error
  fi
  echo "copied database $db"
done < /tmp/databases
echo "upgrade complete: $(wc -l < /tmp/databases) database(s) copied from $OLD_HOST to $NEW_HOST"
"""
