"""The containers' scripts, run exactly as the pods run them, against real PostgreSQL servers
started here (two clusters on one port, on 127.0.0.1 and 127.0.0.2, like two pods behind the
headless Service). Skipped where PostgreSQL's server binaries are not installed."""

from __future__ import annotations

import gzip
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventop.handlers.databases import scripts
from eventop.handlers.databases.workload import PG_HBA

SUPERUSER_PASSWORD = "super-secret-1"


def _bindir() -> Path | None:
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        pg_ctl = str(found[-1]) if found else None
    return Path(pg_ctl).resolve().parent if pg_ctl else None


BINDIR = _bindir()
pytestmark = pytest.mark.skipif(
    BINDIR is None or not (BINDIR / "initdb").exists() or shutil.which("bash") is None,
    reason="PostgreSQL server binaries (initdb, pg_ctl) not installed")


def _as_postgres() -> list[str]:
    """initdb and postgres refuse to run as root: run them as the postgres user then."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root without a postgres user to start servers as")
    return ["runuser", "-u", "postgres", "--"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self, root: Path, host: str, port: int) -> None:
        self.data = root / f"data-{host}"
        self.host, self.port = host, port
        self.log = root / f"log-{host}"

    def start(self) -> None:
        pwfile = self.data.parent / "pw"
        pwfile.write_text(SUPERUSER_PASSWORD)
        run = _as_postgres()
        subprocess.run([*run, str(BINDIR / "initdb"), "-D", str(self.data), "-U", "postgres",
                        "--pwfile", str(pwfile), "-A", "scram-sha-256"],
                       check=True, capture_output=True)
        (self.data / "pg_hba.conf").write_text(PG_HBA)
        subprocess.run([*run, str(BINDIR / "pg_ctl"), "-D", str(self.data), "-l",
                        str(self.log), "-w", "start", "-o",
                        f"-c listen_addresses={self.host} -c port={self.port} "
                        f"-c unix_socket_directories={self.data}"],
                       check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run([*_as_postgres(), str(BINDIR / "pg_ctl"), "-D", str(self.data), "-m",
                        "immediate", "stop"], capture_output=True, check=False)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    # Not under pytest's tmp_path: its parents are private to the user running the tests,
    # which the postgres user (when tests run as root) could not enter.
    root = Path(tempfile.mkdtemp(prefix="eventop-pg-"))
    os.chmod(root, 0o755)
    port = free_port()
    old, new = Server(root, "127.0.0.1", port), Server(root, "127.0.0.2", port)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    try:
        old.start()
        new.start()
        yield old, new
    finally:
        old.stop()
        new.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(script: str, server: Server, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": f"{BINDIR}:{os.environ['PATH']}", "PGHOST": server.host,
            "PGPORT": str(server.port), "PGUSER": "postgres", "PGPASSWORD": SUPERUSER_PASSWORD,
            "WAIT_TRIES": "3", "WAIT_SECONDS": "1", "HOME": "/tmp"}
    return subprocess.run(["bash", "-c", script], env={**base, **env}, capture_output=True,
                          text=True, timeout=120, check=False)


def psql(server: Server, *commands: str, user: str = "postgres",
         password: str = SUPERUSER_PASSWORD, db: str = "postgres", **env: str) -> str:
    args = [str(BINDIR / "psql"), "-h", server.host, "-p", str(server.port), "-U", user,
            "-d", db, "-At"]
    for command in commands:
        args += ["-c", command]
    out = subprocess.run(args, env={**os.environ, "PGPASSWORD": password, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


INIT_ENV = {"APP_USER": "orders", "APP_PASSWORD": "app-pw", "APP_DB": "orders",
            "REPLICATION_PASSWORD": "rep-pw"}


def test_init_creates_the_roles_and_database_and_a_rerun_changes_nothing(
        servers: tuple[Server, Server]) -> None:
    old, _ = servers
    first = run(scripts.INIT, old, **INIT_ENV)
    assert first.returncode == 0, first.stderr
    again = run(scripts.INIT, old, **INIT_ENV)
    assert again.returncode == 0, again.stderr
    assert "app-pw" not in first.stdout + first.stderr
    assert psql(old, "SELECT current_user || '@' || current_database()", user="orders",
                password="app-pw", db="orders") == "orders@orders"
    assert psql(old, "SELECT rolreplication FROM pg_roles WHERE rolname='replicator'") == "t"
    assert psql(old, "SELECT pg_get_userbyid(datdba) FROM pg_database "
                     "WHERE datname='orders'") == "orders"


def test_backups_are_complete_files_and_only_scheduled_ones_are_pruned(
        servers: tuple[Server, Server], tmp_path: Path) -> None:
    old, _ = servers
    run(scripts.INIT, old, **INIT_ENV)
    psql(old, "CREATE TABLE IF NOT EXISTS items (n int); INSERT INTO items VALUES (42)",
         user="orders", password="app-pw", db="orders")
    assert run(scripts.BACKUP, old, BACKUP_DIR=str(tmp_path), BACKUP_KIND="pre-upgrade",
               RETENTION="2").returncode == 0
    for _ in range(3):
        time.sleep(1.1)  # backups are named by the second
        done = run(scripts.BACKUP, old, BACKUP_DIR=str(tmp_path), BACKUP_KIND="scheduled",
                   RETENTION="2")
        assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len([f for f in files if f.endswith("-scheduled.sql.gz")]) == 2
    assert len([f for f in files if f.endswith("-pre-upgrade.sql.gz")]) == 1
    assert not [f for f in files if f.endswith(".partial")]
    dump = gzip.decompress((tmp_path / files[-1]).read_bytes()).decode()
    assert "CREATE ROLE orders" in dump and "42" in dump


def test_a_failed_backup_writes_nothing_and_keeps_the_earlier_ones(
        servers: tuple[Server, Server], tmp_path: Path) -> None:
    old, _ = servers
    assert run(scripts.BACKUP, old, BACKUP_DIR=str(tmp_path), BACKUP_KIND="scheduled",
               RETENTION="1").returncode == 0
    before = sorted(tmp_path.iterdir())
    time.sleep(1.1)
    failed = run(scripts.BACKUP, old, BACKUP_DIR=str(tmp_path), BACKUP_KIND="scheduled",
                 RETENTION="1", PGPASSWORD="wrong")
    assert failed.returncode != 0
    assert "password authentication failed" in failed.stderr
    assert sorted(tmp_path.iterdir()) == before


def test_a_standby_copies_the_primary_with_the_replication_role(
        servers: tuple[Server, Server], tmp_path: Path) -> None:
    old, _ = servers
    run(scripts.INIT, old, **INIT_ENV)
    pgdata = tmp_path / "standby" / "pgdata"
    done = run(scripts.STANDBY, old, HOSTNAME="orders-pg16-1", PGDATA=str(pgdata),
               PRIMARY_HOST=old.host, PGPASSWORD="rep-pw")
    assert done.returncode == 0, done.stderr
    assert (pgdata / "PG_VERSION").exists() and (pgdata / "standby.signal").exists()
    skipped = run(scripts.STANDBY, old, HOSTNAME="orders-pg16-0", PGDATA=str(tmp_path / "p0"),
                  PRIMARY_HOST=old.host)
    assert skipped.returncode == 0 and not (tmp_path / "p0").exists()


def test_the_upgrade_copies_every_role_and_database_and_leaves_the_old_read_only(
        servers: tuple[Server, Server]) -> None:
    old, new = servers
    run(scripts.INIT, old, **INIT_ENV)
    psql(old, "CREATE TABLE IF NOT EXISTS items (n int); INSERT INTO items VALUES (7)",
         user="orders", password="app-pw", db="orders")
    psql(old, "CREATE DATABASE \"other db\"")
    done = run(scripts.UPGRADE, new, OLD_HOST=old.host, NEW_HOST=new.host)
    assert done.returncode == 0, done.stderr
    assert "upgrade complete" in done.stdout
    assert "7" in psql(new, "SELECT n FROM items", user="orders", password="app-pw",
                       db="orders").split()
    assert psql(new, "SELECT count(*) FROM pg_database WHERE datname='other db'") == "1"
    assert psql(old, "SHOW default_transaction_read_only") == "on"
    # Writable again for the next test (as an operator would after a successful upgrade).
    psql(old, "ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()",
         PGOPTIONS="-c default_transaction_read_only=off")


def test_an_upgrade_run_again_over_an_earlier_attempts_copy_starts_over_and_succeeds(
        servers: tuple[Server, Server]) -> None:
    old, new = servers
    writable = ("ALTER SYSTEM RESET default_transaction_read_only", "SELECT pg_reload_conf()")
    run(scripts.INIT, old, **INIT_ENV)
    psql(old, "CREATE TABLE IF NOT EXISTS items (n int)", "INSERT INTO items VALUES (8)",
         user="orders", password="app-pw", db="orders")
    first = run(scripts.UPGRADE, new, OLD_HOST=old.host, NEW_HOST=new.host)
    assert first.returncode == 0, first.stderr
    psql(old, *writable, PGOPTIONS="-c default_transaction_read_only=off")
    # The new server holds an earlier attempt's copy (as after a failed attempt whose Job
    # was deleted to retry), a half-copied postgres database too: it is emptied first, not
    # stopped by "already exists"
    psql(new, "CREATE TABLE leftover (n int)")
    psql(old, "INSERT INTO items VALUES (9)", user="orders", password="app-pw", db="orders")
    again = run(scripts.UPGRADE, new, OLD_HOST=old.host, NEW_HOST=new.host)
    assert again.returncode == 0, again.stderr
    rows = "SELECT n FROM items ORDER BY n"
    assert psql(new, rows, user="orders", password="app-pw", db="orders") == \
        psql(old, rows, user="orders", password="app-pw", db="orders")
    assert psql(new, "SELECT count(*) FROM pg_tables WHERE tablename = 'leftover'") == "0"
    psql(old, *writable, PGOPTIONS="-c default_transaction_read_only=off")


def test_a_failed_upgrade_makes_the_old_server_writable_again(
        servers: tuple[Server, Server]) -> None:
    old, new = servers
    # The new server has a template database "orders", which the start-over leaves alone (so
    # its owner, role "orders", can not be dropped): the copy stops, as on any error.
    run(scripts.INIT, old, **INIT_ENV)  # idempotent: the old server has database "orders"
    if psql(new, "SELECT count(*) FROM pg_database WHERE datname = 'orders'") == "0":
        psql(new, "CREATE DATABASE orders")
    psql(new, "ALTER DATABASE orders IS_TEMPLATE true")
    try:
        failed = run(scripts.UPGRADE, new, OLD_HOST=old.host, NEW_HOST=new.host)
    finally:
        psql(new, "ALTER DATABASE orders IS_TEMPLATE false")
    assert failed.returncode != 0
    assert "accepts writes again" in failed.stderr
    assert psql(old, "SHOW default_transaction_read_only") == "off"


def test_a_backup_restored_into_a_new_database_keeps_the_new_servers_passwords(
        servers: tuple[Server, Server], tmp_path: Path) -> None:
    """The README's restore into a new Database (its init done, its own Secret): the data
    comes over and every login the new Secret holds still works. A trial restored a
    pg_dumpall into such a server: its passwords became the old server's (the new Secret's
    refused), the script stopped at its first \\connect, and no data came over."""
    old, new = servers
    run(scripts.INIT, old, **INIT_ENV)
    psql(old, "CREATE TABLE restored (n int); INSERT INTO restored VALUES (42)",
         user="orders", password="app-pw", db="orders")
    psql(old, "CREATE ROLE reporting LOGIN PASSWORD 'old-reporting-pw'")
    done = run(scripts.BACKUP, old, BACKUP_DIR=str(tmp_path), BACKUP_KIND="scheduled",
               RETENTION="2")
    assert done.returncode == 0, done.stderr
    [backup] = tmp_path.iterdir()
    assert "PASSWORD" not in gzip.decompress(backup.read_bytes()).decode()
    # the new Database: its own superuser password, its init run with its own Secret (last
    # in this module: the servers are shared, and this one keeps what was restored)
    psql(new, "ALTER ROLE postgres PASSWORD 'new-super'")
    fresh = {**INIT_ENV, "APP_PASSWORD": "new-app-pw", "REPLICATION_PASSWORD": "new-rep-pw"}
    assert run(scripts.INIT, new, PGPASSWORD="new-super", **fresh).returncode == 0
    # the README's restore Job's command, its /backups being tmp_path
    from tests.databases.test_restore_docs import restore_job

    [container] = restore_job()["spec"]["template"]["spec"]["containers"]
    command = container["command"][2].replace("/backups", str(tmp_path))
    restore = subprocess.run(
        ["bash", "-c", command], capture_output=True,
        text=True, timeout=120, env={**os.environ, "PATH": f"{BINDIR}:{os.environ['PATH']}",
                                     "PGHOST": new.host, "PGPORT": str(new.port),
                                     "PGUSER": "postgres", "PGPASSWORD": "new-super"})
    assert restore.returncode == 0, restore.stderr
    assert psql(new, "SELECT n FROM restored", user="orders", password="new-app-pw",
                db="orders") == "42"
    assert psql(new, "SELECT 1", password="new-super") == "1"
    assert psql(new, "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'reporting'",
                password="new-super") == "t"  # made, without a password: the user sets one
    (tmp_path / "b").mkdir()
    again = run(scripts.BACKUP, new, PGPASSWORD="new-super", BACKUP_DIR=str(tmp_path / "b"),
                BACKUP_KIND="scheduled", RETENTION="2")  # the new Database's own backups
    assert again.returncode == 0, again.stderr

