"""backup create / list / restore / prune: checksummed, cheap, byte-identical."""

from __future__ import annotations

import json

from tests.helpers.project import Proj
from tests.helpers.series import three_patches


def test_backups_store_only_what_differs_from_pristine(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    b = proj.json("backup", "create", "before-experiment")
    assert b["name"].endswith("-before-experiment")
    assert b["stored"] == 3  # a.c, b.c, new.c: the rest is in the pristine cache
    assert b["files"] == len(list(p for p in proj.tree.rglob("*") if p.is_file()))


def test_restore_returns_tree_byte_identical(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    before = proj.state_digest()
    name = proj.json("backup", "create", "snap")["name"]
    proj.run("unapply")
    proj.edit("up/src/a.c", "int tail", "int changed")
    (proj.tree / "up/src/extra.c").write_text("stray\n")
    res = proj.json("backup", "restore", name)
    assert res["backup"]  # the tree being replaced was backed up first
    assert proj.state_digest() == before
    proj.run("verify")


def test_tampered_backup_is_refused_and_tree_untouched(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    name = proj.json("backup", "create", "snap")["name"]
    objs = [p for p in (proj.root / ".opencoti/vendor-backups" / name / "objects").rglob("*") if p.is_file()]
    data = bytearray(objs[0].read_bytes())
    data[0] ^= 1
    objs[0].write_bytes(bytes(data))
    proj.run("unapply")
    before = proj.state_digest()
    code, out, err = proj.run("backup", "restore", name, expect=1)
    assert "corrupt" in err or "sha256" in err
    assert proj.state_digest() == before


def test_tampered_manifest_is_refused(proj: Proj):
    three_patches(proj)
    proj.run("apply")
    name = proj.json("backup", "create", "snap")["name"]
    mf = proj.root / ".opencoti/vendor-backups" / name / "manifest.json"
    m = json.loads(mf.read_text())
    first = sorted(m["files"])[0]
    m["files"][first][0] = "0" * 64
    mf.write_text(json.dumps(m))
    code, out, err = proj.run("backup", "restore", name, expect=1)
    assert "digest" in err


def test_list_and_prune_keep_newest(proj: Proj):
    three_patches(proj)
    names = [proj.json("backup", "create", f"b{i}")["name"] for i in range(4)]
    listed = [b["name"] for b in proj.json("backup", "list")["backups"]]
    assert listed == sorted(listed) and set(names) <= set(listed)
    res = proj.json("backup", "prune", "--keep", "2")
    left = [b["name"] for b in proj.json("backup", "list")["backups"]]
    assert left == listed[-2:] and sorted(res["removed"]) == sorted(listed[:-2])


def test_every_mutating_command_takes_a_named_backup(proj: Proj):
    three_patches(proj)
    proj.run("apply", "--upto", "0071")
    proj.run("apply")
    proj.run("unapply", "--to", "0070")
    names = [b["name"] for b in proj.json("backup", "list")["backups"]]
    assert [n[16:] for n in names] == ["apply-0071", "apply-0089", "unapply-to-0070"]


def test_unknown_backup_name(proj: Proj):
    code, out, err = proj.run("backup", "restore", "nope", expect=1)
    assert "backup list" in err
