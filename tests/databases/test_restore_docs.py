"""The README's restore Job names what the Database handler makes: its backup claim, its
credentials Secret and key, its client Service; and it is a valid Job."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import yaml

from eventop.handlers.databases.spec import Names
from eventop.handlers.databases.workload import Passwords
from tests.install.support import KUBERNETES_VERSIONS

README = Path(__file__).resolve().parents[2] / "README.md"


def restore_job() -> dict:
    text = README.read_text()
    section = text[text.index("**Restoring a backup.**"):text.index("**Upgrades.**")]
    [block] = re.findall(r"^```yaml\n(.*?)^```", section, re.S | re.M)
    return dict(yaml.safe_load(block))


def test_the_readme_restore_job_mounts_the_old_backups_and_logs_into_the_new_database() -> None:
    job = restore_job()
    kubernetes_validate.validate(job, KUBERNETES_VERSIONS[0], strict=True)
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == Names.of("orders").backup_pvc
    assert env["PGHOST"]["value"] == Names.of("orders2").service
    ref = env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == Names.of("orders2").secret and ref["key"] in Passwords.KEYS
    assert env["PGUSER"]["value"] == "postgres"
    assert "| psql -d postgres" in container["command"][2]
