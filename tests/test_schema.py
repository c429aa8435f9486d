"""The one validation mechanism: safe reading, strict YAML/JSON, schema errors naming file and key; tar safety."""

from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path

import jsonschema
import pytest
import yaml

from forktool import archive, schema, schemas
from forktool.errors import ConfigError, ForktoolError, UnsafePathError
from forktool.store import ObjectStore
from tests import corpus


@pytest.mark.parametrize("name", sorted(schemas.SCHEMAS))
def test_every_schema_is_a_valid_json_schema(name: str) -> None:
    s = schemas.SCHEMAS[name]
    jsonschema.validators.validator_for(s).check_schema(s)


def test_every_schema_names_what_to_do_about_a_refusal() -> None:
    # the `next:` of every schema refusal comes from schemas.fix: a schema without one would refuse with no hint
    assert all(schemas.fix(name).strip() for name in schemas.SCHEMAS)


def test_the_shipped_configs_pass_their_schemas() -> None:
    root = corpus.REPO
    schema.load_yaml(root / "registry" / "UPSTREAM_SYNC.yaml", "registry")
    schema.load_yaml(root / "registry" / "build.yaml", "build")
    schema.load_yaml(root / "vendor" / "vendor.yaml", "vendor")
    schema.load_json(root / "vendor" / "vendor.lock", "vendor-lock")


def test_bool_is_not_an_int_and_errors_name_file_and_key(tmp_path: Path) -> None:
    p = tmp_path / "UPSTREAM_SYNC.yaml"
    p.write_text("schema: true\npatches: []\nhooks: {}\n")
    with pytest.raises(ConfigError) as e:
        schema.load_yaml(p, "registry")
    assert "UPSTREAM_SYNC.yaml: schema" in e.value.where and "expected 1" in e.value.what


@pytest.mark.parametrize("text, problem", [
    ("a: .inf\n", "infinite or NaN"), ("a: .nan\n", "infinite or NaN"), ("a: 1\na: 2\n", "duplicate key"),
    ("a: " + "[" * 100 + "]" * 100 + "\n", "nested more than"),
    ("x: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
])
def test_yaml_is_strict(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        schema.parse_yaml(text, "f.yaml")


def test_alias_bomb_is_bounded() -> None:
    text = corpus._billion_laughs().decode()
    with pytest.raises(ConfigError, match="expands to more than"):
        schema.parse_yaml(text, "f.yaml")


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": 1e999}', '{"a": 1, "a": 2}',
                                  "[" * 100000 + "]" * 100000])
def test_json_is_strict(text: str) -> None:
    with pytest.raises(ConfigError):
        schema.parse_json(text, "f.json")


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            schema.read_regular(fifo)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            done.append(e)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert done and isinstance(done[0], ConfigError) and "FIFO" in str(done[0])
    with pytest.raises(ConfigError, match="directory"):
        schema.read_regular(tmp_path)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(ConfigError, match="limit"):
        schema.read_regular(big, limit=1024)


def test_symlinks_are_not_followed_out_of_their_root(tmp_path: Path) -> None:
    (tmp_path / "outside.yaml").write_text("a: 1\n")
    root = tmp_path / "root"
    (root / "registry").mkdir(parents=True)
    (root / "registry" / "x.yaml").symlink_to(tmp_path / "outside.yaml")
    with pytest.raises(UnsafePathError, match="symlink"):
        schema.read_regular(root / "registry" / "x.yaml", root=root)


def _tar(members: list[tuple]) -> bytes:
    return corpus._tar(members)


def test_archive_resolves_links_as_a_chain(tmp_path: Path) -> None:
    chain = [("file", "p/src/a.c", b"int a;\n"), ("dir", "p/src/a/b/c/d/e"),
             ("sym", "p/src/a/b/c/d/e/l", "../../../.."), ("sym", "p/src/y", "a/b/c/d/e/l/../../../../..")]
    with pytest.raises(UnsafePathError, match="leaves the root"):
        archive.extract_to_store(_tar(chain), ObjectStore(tmp_path / "o"), "test", strip_top=True, subdir="",
                                 keep=lambda _r: True)
    assert not (tmp_path / "o").exists()  # nothing kept


def test_archive_keeps_safe_links_and_refuses_writes_through_them(tmp_path: Path) -> None:
    ok = [("file", "p/src/a.c", b"int a;\n"), ("sym", "p/src/b.c", "a.c"), ("sym", "p/inc", "src")]
    manifest, skipped = archive.extract_to_store(_tar(ok), ObjectStore(tmp_path / "o"), "test", strip_top=True,
                                                 subdir="", keep=lambda _r: True)
    assert sorted(manifest) == ["inc", "src/a.c", "src/b.c"] and skipped == 0
    with pytest.raises(UnsafePathError, match="through the symlink"):
        list(archive.members(_tar(ok + [("file", "p/inc/x.h", b"x")]), "test", strip_top=True))


def test_extract_to_dir_writes_only_after_the_whole_archive_passed(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name in ("r/ok.txt", "r/../../evil.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            t.addfile(info, io.BytesIO(b"x\n"))
    arc = tmp_path / "a.tar.gz"
    arc.write_bytes(buf.getvalue())
    with pytest.raises(ForktoolError):
        archive.extract_to_dir(arc, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "evil.txt").exists()


def test_schema_error_for_unknown_key_lists_the_allowed_ones(tmp_path: Path) -> None:
    p = tmp_path / "build.yaml"
    doc = yaml.safe_load(corpus.BUILD_YAML)
    doc["profiles"]["cpu"]["colour"] = "red"
    p.write_text(yaml.safe_dump(doc))
    from forktool.build import _parse_profiles
    raw = schema.load_yaml(p, "build")
    with pytest.raises(ConfigError) as e:
        _parse_profiles(raw["profiles"], f"{p}: profiles")
    assert "unknown key(s): colour" in e.value.what and "flags" in e.value.hint


def test_a_value_of_the_wrong_type_is_named_as_such_beside_the_form_it_must_take() -> None:
    for value, what in ((1342, "a number"), (["a"], "a list"), (True, "a boolean")):
        with pytest.raises(ConfigError) as e:
            schema.check({"schema": 1, "patches": [{"id": "0070", "file": "0070-x.patch", "title": "t", "bug": value,
                                                    "status": "dev", "build_impact": [], "files": [], "hooks": []}],
                          "hooks": {}}, "registry", "r.yaml")
        # it said only "expected one line of text", which a one-line 1342 seems to be
        assert e.value.what == f"expected one line of text: got {what} (quote it in YAML)", e.value.what
        assert e.value.where == "r.yaml: patches[0].bug"
