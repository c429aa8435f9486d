"""The JSON Schema of every file forktool reads; forktool/schema.py loads and checks against them.

`x-error` on a subschema replaces the generic message for a failure there; `x-hint` adds what to do. `FIX` says,
for each document, where a refusal is fixed and what checks it again: every schema refusal ends with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


DRAFT = "https://json-schema.org/draft/2020-12/schema"

SHA256 = {"type": "string", "pattern": r"^[0-9a-f]{64}\Z", "x-error": "expected 64 lowercase hex digits (a sha256)"}
COMMIT = {"type": "string", "pattern": r"^[0-9a-f]{40}\Z", "x-error": "expected a full 40-hex commit id"}
MODE = {"enum": ["100644", "100755", "120000"]}
PATCH_ID = {"type": "string", "pattern": r"^\d{4}\Z", "x-error": "a patch id is four digits (quote it in YAML)"}
PATCH_NAME = {"type": "string", "pattern": r"^\d{4}-[A-Za-z0-9._-]+\.patch\Z", "maxLength": 200,
              "x-error": "a patch file name is NNNN-slug.patch"}
# a plain relative POSIX path: no '', '.', '..' segment, no leading '/', no NUL, backslash or newline
REL_PATH = {"type": "string", "maxLength": 4096,
            "pattern": r"^(?!/)(?!(?:.*/)?\.{1,2}(?:/|\Z))(?!.*//)[^\x00\\\n\r]+(?<!/)\Z",
            "x-error": "expected a plain relative path inside its root (no '..', '.', absolute or empty parts)"}
GLOB = {"type": "string", "minLength": 1, "maxLength": 4096,
        "pattern": r"^(?!/)(?!(?:.*/)?\.\.(?:/|\Z))[^\x00\n\r]+\Z",
        "x-error": "a pattern must be relative and stay inside the component"}
TEXT = {"type": "string", "maxLength": 100_000}
LINE = {"type": "string", "maxLength": 1000, "pattern": r"^[^\n\r\x00]*\Z", "x-error": "expected one line of text"}
NAME = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z", "maxLength": 100,
        "x-error": "must be a plain directory name (letters, digits, '.', '_', '-')"}
COUNT = {"type": "integer", "minimum": 0, "maximum": 10_000_000}


def strings(item: dict[str, Any] | None = None, min_items: int = 0) -> dict[str, Any]:
    return {"type": "array", "items": item or {"type": "string", "minLength": 1, "maxLength": 4096},
            "minItems": min_items, "maxItems": 100_000}


def obj(props: dict[str, Any], required: list[str] | tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False,
            **extra}


# ---------------------------------------------------------------- vendor/vendor.yaml

KINDS = ["sdist", "tarball", "dir", "git"]
_COMMON = {"name": NAME, "kind": {"enum": KINDS}, "subdir": {**REL_PATH, "x-error":
                                                                        "subdir must stay inside the archive"},
           "upstream_commit": {**COMMIT, "x-error": "upstream_commit must be a full 40-hex commit id"},
           "include": {**strings(GLOB), "x-error": "expected a list of glob patterns"},
           "exclude": {"type": ["array", "null"], "items": GLOB, "x-error": "expected a list of glob patterns"}}
COMPONENT_SDIST = obj({**_COMMON, "package": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z",
                                              "maxLength": 200, "x-error": "expected a package name"},
                       "version": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*\Z", "maxLength": 100,
                                   "x-error": "expected a version (quote it in YAML: '1.0')"},
                       "sha256": {**SHA256, "x-error": "sha256 must be 64 lowercase hex digits"}},
                      ["name", "kind", "package", "version", "sha256", "include"])
COMPONENT_GIT = obj({**_COMMON, "url": {"type": "string", "minLength": 1, "maxLength": 4096},
                     "commit": {**COMMIT, "x-error": "commit must be a full 40-hex commit id"}},
                    ["name", "kind", "url", "commit", "include"])
COMPONENT_TARBALL = obj({**_COMMON, "url": {"type": "string", "minLength": 1, "maxLength": 4096,
                                            "pattern": r"^(https?|file)://[^\s]+\Z",
                                            "x-error": "url must be an https://, http:// or file:// URL"},
                         "sha256": {**SHA256, "x-error": "sha256 must be 64 lowercase hex digits"}},
                        ["name", "kind", "url", "sha256", "include"])
COMPONENT_DIR = obj({**_COMMON, "path": {"type": "string", "minLength": 1, "maxLength": 4096,
                                         "pattern": r"^[^\x00\n\r]+\Z", "x-error": "path must name a directory"}},
                    ["name", "kind", "path", "include"])
VENDOR = obj({"components": {"type": "array", "minItems": 1, "maxItems": 100,
                             "items": {"type": "object", "required": ["kind"],
                                       "properties": {"kind": {"enum": KINDS, "x-error":
                                                               "unknown component kind (expected "
                                                               + ", ".join(KINDS) + ")"}}},
                             "x-error": "components must be a non-empty list"}},
             ["components"])

# ---------------------------------------------------------------- vendor/vendor.lock

VENDOR_LOCK = obj({
    "components": {"type": "object", "propertyNames": NAME, "minProperties": 1, "maxProperties": 100,
                   "x-error": "components must record the pinned component(s); run `forktool vendor fetch`",
                   "additionalProperties": obj({
        "kind": {"enum": KINDS}, "spec": {"type": "string", "maxLength": 4096},
        "sha256": {"type": "string", "pattern": r"^([0-9a-f]{64})?\Z"},
        "upstream_commit": {"type": "string", "pattern": r"^([0-9a-f]{40})?\Z"},
        "include": strings(GLOB), "exclude": strings(GLOB), "subdir": {"type": "string", "maxLength": 4096}},
        ["kind", "spec", "sha256", "upstream_commit", "include", "exclude", "subdir"])},
    "pristine_digest": SHA256,
    "pristine_files": COUNT,
    "patched": obj({"series_digest": SHA256, "tree_digest": SHA256, "top": PATCH_ID},
                   dependentRequired={"series_digest": ["tree_digest", "top"], "tree_digest": ["series_digest", "top"],
                                      "top": ["series_digest", "tree_digest"]}),
}, ["components", "pristine_digest", "pristine_files", "patched"])

# ---------------------------------------------------------------- registry/UPSTREAM_SYNC.yaml

GATE = obj({"name": {**LINE, "minLength": 1}, "needs": {"type": "array", "minItems": 1, "maxItems": 2,
                                                        "items": {"enum": ["cpu", "cuda"]},
                                                        "x-error": "needs must be a non-empty list of cpu, cuda"},
            "command": {**strings(min_items=1), "x-error": "command must be a non-empty list of strings"},
            "proves": TEXT, "timeout": {"type": "integer", "minimum": 1, "maximum": 7 * 24 * 3600,
                                        "x-error": "timeout must be whole seconds between 1 and 604800"},
            # what each part of a gate made of parts checks (the program names the parts it ran: `forktool gates`)
            "parts": {"type": "object", "minProperties": 1, "maxProperties": 100,
                      "propertyNames": {"pattern": r"^[a-z0-9][a-z0-9_-]*\Z", "maxLength": 40,
                                        "x-error": "a part's name is lower-case letters, digits, _ or - (a, b, ...)"},
                      "additionalProperties": {**LINE, "minLength": 1,
                                               "x-error": "a part's sentence is one line saying what it checks"},
                      "x-error": "parts maps a part's name (a, b, ... : lower-case letters, digits, _ or -) to one line "
                                 "saying what that part checks"}},
           ["name", "needs", "command", "proves"])
REGISTRY_PATCH = obj({
    "id": {**PATCH_ID, "x-error": "patch id must be four digits (quote it: '0070')"}, "file": PATCH_NAME,
    "title": LINE, "bug": LINE,
    "status": {"enum": ["dev", "shipped", "upstreamed", "dropped"],
               "x-error": "status must be one of dev, shipped, upstreamed, dropped"},
    "shipped": LINE, "description": TEXT,
    "build_impact": {"type": "array", "maxItems": 2, "items": {"enum": ["host", "cuda-dso"]},
                     "x-error": "build_impact is a list of host, cuda-dso"},
    "files": strings(REL_PATH), "hooks": strings({"type": "string", "pattern": r"^[a-z0-9][a-z0-9._-]*\Z"}),
    "gates": {"type": "array", "items": GATE, "maxItems": 1000},
}, ["id", "file", "title", "status", "build_impact", "files", "hooks"])
SITE = obj({"file": REL_PATH, "symbol": {"type": "string", "minLength": 1, "maxLength": 1000},
            "line": {"type": "integer", "minimum": 1, "maximum": 100_000_000,
                     "x-error": "line must be a positive whole number (advisory)"}},
           ["file", "symbol"])
REGISTRY = obj({
    "schema": {"const": 1, "type": "integer", "x-error": "unsupported schema (expected 1)"},
    "patches": {"type": "array", "items": REGISTRY_PATCH, "maxItems": 10000, "x-error": "patches must be a list"},
    "hooks": {"type": "object", "maxProperties": 100000,
              "propertyNames": {"pattern": r"^[a-z0-9][a-z0-9._-]*\Z", "maxLength": 200,
                                "x-error": "bad hook id (lowercase, digits, '-', '.', '_')"},
              "additionalProperties": obj({"patch": PATCH_ID, "description": TEXT,
                                           "sites": {"type": "array", "items": SITE, "minItems": 1, "maxItems": 10000,
                                                     "x-error": "sites must be a non-empty list"}},
                                          ["patch", "sites"]),
              "x-error": "hooks must be a mapping of hook id to its entry"},
}, ["schema", "patches", "hooks"])

# ---------------------------------------------------------------- registry/build.yaml

_NONEMPTY = {"type": "string", "minLength": 1, "maxLength": 4096}
ARTIFACT = obj({
    "name": {**_NONEMPTY, "x-error": "an artifact needs a name"},
    "impact": {"anyOf": [{"enum": ["host", "cuda-dso"]},
                         {"type": "array", "minItems": 1, "items": {"enum": ["host", "cuda-dso"]}}],
               "x-error": "impact must be one or more of host, cuda-dso"},
    "paths": {"type": ["array", "null"], "items": _NONEMPTY, "x-error": "expected a list of non-empty strings"},
    "targets": {"type": ["array", "null"], "items": _NONEMPTY, "x-error": "expected a list of non-empty strings"},
    "outputs": {"type": ["array", "null"], "items": {**REL_PATH, "x-error": "an output must be relative to the "
                                                     "build directory"}},
    "profiles": {"type": ["array", "null"], "items": _NONEMPTY, "x-error": "expected a list of non-empty strings"},
}, ["name", "impact"])
PROFILE = obj({
    "inherits": {"type": "string", "minLength": 1, "maxLength": 200},
    "generator": {"type": "string", "maxLength": 200},
    "flags": {"type": ["array", "null"], "items": _NONEMPTY, "x-error": "expected a list of non-empty strings"},
    "targets": {"type": ["array", "null"], "items": _NONEMPTY, "x-error": "expected a list of non-empty strings"},
    "cuda_architectures": {"anyOf": [{"type": "integer", "minimum": 10, "maximum": 1000},
                                     {"type": "string", "pattern": r"^\d{2,3}[a-z]?(;\d{2,3}[a-z]?)*\Z"}],
                           "x-error": "cuda_architectures is like '90' or '80;90' (compute capabilities)"},
})
BUILD = obj({
    "artifacts": {"type": "array", "minItems": 1, "maxItems": 1000, "items": {"type": "object"},
                  "x-error": "`artifacts` must be a non-empty list"},
    "links": {"type": ["object", "null"], "additionalProperties": {"type": "array", "items": _NONEMPTY},
              "x-error": "`links` must map an artifact to the artifacts it links"},
    "stamped": {"type": ["array", "null"], "items": _NONEMPTY, "x-error": "expected a list of non-empty strings"},
    "profiles": {"type": "object", "minProperties": 1, "maxProperties": 100,
                 "propertyNames": {"pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z", "maxLength": 100},
                 "additionalProperties": {"type": "object"},
                 "x-error": "`profiles` must be a non-empty mapping of name -> recipe"},
}, ["artifacts", "profiles"])

# ---------------------------------------------------------------- .opencoti/state.json, the journal, backups

ENTRY = {"type": "array", "prefixItems": [SHA256, MODE], "minItems": 2, "maxItems": 2,
         "x-error": "a file entry is [sha256, mode]"}
FILES = {"type": "object", "propertyNames": REL_PATH, "additionalProperties": ENTRY, "maxProperties": 10_000_000}
DRIFT = obj({"patch": PATCH_ID, "file": REL_PATH, "hunk": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
             "offset": {"type": "integer", "minimum": -100_000_000, "maximum": 100_000_000}},
            ["patch", "file", "hunk", "offset"])
APPLIED = obj({"id": PATCH_ID, "name": PATCH_NAME, "sha256": SHA256, "diff_sha256": SHA256,
               "drift": {"type": "array", "items": DRIFT, "maxItems": 100_000}},
              ["id", "name", "sha256"])
STATE = obj({
    "version": {"const": 1, "type": "integer", "x-error": "unsupported state version (expected 1)"},
    "pristine_digest": {"type": "string", "pattern": r"^([0-9a-f]{64})?\Z", "x-error": "expected a sha256 or ''"},
    "applied": {"type": "array", "items": APPLIED, "maxItems": 10000},
    "files": {"type": "object", "propertyNames": REL_PATH, "maxProperties": 10_000_000,
              "additionalProperties": {"anyOf": [{"type": "null"}, ENTRY], "x-error": "a file entry is [sha256, mode] "
                                       "or null (deleted)"}},
}, ["version", "pristine_digest", "applied", "files"])
JOURNAL = obj({
    "entries": {"type": "array", "maxItems": 10_000_000, "items": obj({
        "path": REL_PATH,
        "staged": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": r"^\d{1,9}\Z"}],
                   "x-error": "staged must be null or the number of a file in txn/new"},
        "mode": MODE, "sha256": {"anyOf": [{"type": "null"}, SHA256]}}, ["path", "staged", "mode"])},
    "state": {"type": "object", "maxProperties": 100},
    # the backup taken just before the update, which `forktool recover` rolls back to
    "backup": {"type": "string", "pattern": r"^\d{8}-\d{6}-[a-z0-9-]+\Z", "maxLength": 200,
               "x-error": "expected the name of a backup directory (YYYYMMDD-HHMMSS-slug)"},
}, ["entries", "state"])
BACKUP = obj({
    "name": {"type": "string", "pattern": r"^\d{8}-\d{6}-[a-z0-9-]+\Z", "maxLength": 200},
    "created": {"type": "string", "maxLength": 100}, "reason": TEXT, "tree_digest": SHA256, "files": FILES,
    "stored": {"type": "array", "items": REL_PATH, "maxItems": 10_000_000, "uniqueItems": True},
    "state": {"type": "object", "maxProperties": 100}, "checksum": SHA256,
}, ["name", "created", "reason", "tree_digest", "files", "stored", "state"])
PRISTINE = FILES
# build/<profile>/forktool-build.json, written by `forktool build`; keys it may grow later are let through
BUILD_RECORD = {"type": "object", "properties": {
    "profile": {"type": "string", "maxLength": 200}, "stamp": {"type": "string", "maxLength": 200},
    "dirty": {"anyOf": [{"type": "boolean"}, strings()]},
    "applied": {"type": "array", "maxItems": 10000, "items": {"type": "object", "required": ["id", "name", "sha256"],
                                                             "properties": {"id": PATCH_ID, "name": PATCH_NAME,
                                                                            "sha256": SHA256,
                                                                            "files": strings(REL_PATH)}}},
    "outputs": {"type": "object", "propertyNames": REL_PATH, "additionalProperties": SHA256},
    # every file a release of this build ships (bin/NAME -> sha256): `forktool package` ships only these bytes
    "shipped": {"type": "object", "propertyNames": REL_PATH, "additionalProperties": SHA256},
    # the pristine digest of the upstream the built tree was made from ('' when the caller did not say)
    "pristine": {"type": "string", "pattern": r"^([0-9a-f]{64})?\Z", "x-error": "expected a sha256 or ''"},
    "flags": strings(), "targets": strings(), "objects": COUNT,
    "seconds": {"type": "number", "minimum": 0, "maximum": 1e7},
    "make_seconds": {"type": "number", "minimum": 0, "maximum": 1e7},
    "cache": {"type": ["object", "null"]}},
    "required": ["profile", "stamp", "dirty", "applied", "outputs"]}

# ---------------------------------------------------------------- .opencoti/sync/state.json (forktool sync)

# every name the loop later joins to a directory to read, write, delete or restore stays one plain file name there
BACKUP_NAME = {"type": "string", "pattern": r"^\d{8}-\d{6}-[a-z0-9-]+\Z", "maxLength": 200,
               "x-error": "expected the name of a backup directory (YYYYMMDD-HHMMSS-slug)"}
SPEC = {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": r"^[^\n\r\x00]+\Z",
        "x-error": "expected one line naming an upstream"}
_OPTIONAL_HEX = {"sha256": {"type": "string", "pattern": r"^([0-9a-f]{64})?\Z", "x-error": "expected a sha256 or ''"},
                 "commit": {"type": "string", "pattern": r"^([0-9a-f]{40})?\Z", "x-error": "expected a commit id or ''"}}
SYNC_COMPONENT = obj({
    "name": NAME, "kind": {"enum": KINDS}, "include": strings(GLOB), "exclude": strings(GLOB),
    "upstream_commit": _OPTIONAL_HEX["commit"], "package": {"type": "string", "maxLength": 200},
    "version": {"type": "string", "maxLength": 100}, "sha256": _OPTIONAL_HEX["sha256"],
    "subdir": {"anyOf": [{"const": ""}, REL_PATH], "x-error": "subdir must stay inside the archive"},
    "url": {"type": "string", "maxLength": 4096}, "commit": _OPTIONAL_HEX["commit"],
    "path": {"type": "string", "maxLength": 4096}},
    ["name", "kind", "include", "exclude", "upstream_commit", "package", "version", "sha256", "subdir", "url",
     "commit"])
_FILE_STATUS = {"enum": ["clean", "offset", "merged", "conflict", "upstreamed", "resolved", "compile error"]}
# the API drift lines of a patch (forktool/sync/apidrift.py), as shown at a stop and in the summary
API_LINES = {"type": "array", "maxItems": 100_000, "items": {"type": "string", "maxLength": 100_000}}
# a profile's scoped compile check, as the sync keeps it
SYNC_COMPILE = obj({"profile": NAME, "status": {"enum": ["compiled", "failed", "not compiled"]}, "reason": TEXT,
                    "units": COUNT}, ["profile", "status", "reason", "units"])
SYNC_DONE = obj({
    "id": PATCH_ID, "name": PATCH_NAME, "api": API_LINES,
    "status": {"enum": ["clean", "offset", "merged", "conflict", "upstreamed", "resolved", "skipped"]},
    "drift": {"type": "array", "items": DRIFT, "maxItems": 100_000},
    "files": {"type": "array", "maxItems": 100_000, "items": obj({"file": REL_PATH, "status": _FILE_STATUS},
                                                                 ["file", "status"])}},
    ["id", "name", "status", "drift", "files"])
SYNC_STOP = obj({
    "id": PATCH_ID, "name": PATCH_NAME, "title": {"type": "string", "maxLength": 1000}, "api": API_LINES,
    "files": {"type": "array", "maxItems": 100_000, "items": obj({
        "file": REL_PATH, "status": _FILE_STATUS, "reason": TEXT,
        "hunks": {"type": "array", "maxItems": 100_000, "items": obj({
            "hunk": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
            "how": {"enum": ["exact", "offset", "changed"]},
            "offset": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": -100_000_000,
                                                    "maximum": 100_000_000}]}}, ["hunk", "how", "offset"])},
        "blocks": {"type": "array", "maxItems": 100_000, "items": {"type": "integer", "minimum": 1,
                                                                   "maximum": 100_000_000}},
        "remembered": COUNT},
        ["file", "status", "reason", "hunks", "blocks"])},
    # a stop is a conflict, a 3-way merge to review (its hunks, and the diff digest that --continue keeps), or a
    # compile error (the tree holds the patches before it and its own change; what failed, where)
    "kind": {"enum": ["conflict", "merged", "compile"]}, "review": {"type": "string", "maxLength": 32 << 20},
    "merged_diff_sha256": SHA256,
    # files put back whole as the maintainer left them when the same stop read the same before
    "remembered_files": {"type": "array", "maxItems": 100_000, "items": REL_PATH},
    "compile": obj({"profile": NAME, "cause": TEXT, "where": TEXT, "log": TEXT,
                    "failed": {"type": "array", "maxItems": 100_000, "items": REL_PATH}},
                   ["profile", "cause", "where", "log", "failed"]),
    # what the compile check at this stop compiled, per profile (the carried patches, or the resolved patch's units)
    "checked": {"type": "array", "maxItems": 1000, "items": SYNC_COMPILE}},
    ["id", "name", "title", "files"])
SYNC_STATE = obj({
    "version": {"const": 1, "type": "integer", "x-error": "unsupported sync state version (expected 1)"},
    "stage": {"enum": ["starting", "stopped", "finishing", "finished", "aborted"]},
    "component": NAME, "from_spec": SPEC, "to_spec": SPEC, "to": SYNC_COMPONENT,
    "old_pristine_digest": SHA256, "new_pristine_digest": SHA256, "tree_digest_before": SHA256,
    "backups": obj({"tree": BACKUP_NAME, "project": BACKUP_NAME},
                   dependentRequired={"tree": ["project"], "project": ["tree"]}),
    "original": {"type": "array", "maxItems": 10_000, "items": {
        "type": "array", "prefixItems": [PATCH_NAME, {"type": "string", "maxLength": 32 << 20}], "minItems": 2,
        "maxItems": 2, "x-error": "an original patch is [file name, text]"}},
    "position": COUNT,
    "done": {"type": "array", "items": SYNC_DONE, "maxItems": 10_000},
    "stop": {"anyOf": [{"type": "null"}, SYNC_STOP]},
    "started": {"type": "string", "maxLength": 100},
    "review_merged": {"type": "boolean"},
    # a move onto another upstream, or `apply --reanchor` carrying the series onto its own edited patches
    "kind": {"enum": ["upstream", "reanchor"]},
    # undo.json only: what the finish left (every project file's sha256 and the tree digest)
    "finished": obj({"tree_digest": SHA256, "files": {"type": "object", "propertyNames": REL_PATH,
                                                      "additionalProperties": SHA256, "maxProperties": 1_000_000}},
                    ["tree_digest", "files"]),
    "hooks": obj({"registry": {"type": "boolean"}, "error": TEXT,
                  "sites": {"type": "array", "maxItems": 1_000_000, "items": {"type": "object", "maxProperties": 20}}},
                 ["registry", "sites"]),
    "compile": {"type": "array", "maxItems": 1000, "items": SYNC_COMPILE},
}, ["version", "stage", "component", "from_spec", "to_spec", "to", "old_pristine_digest", "new_pristine_digest",
    "tree_digest_before", "backups", "original", "position", "done", "stop", "started"])

# .opencoti/sync/ended.json: how the last sync ended without a finish `--undo` could take back (undone or aborted),
# so that a second `--undo` says the first one finished rather than "no finished sync"
SYNC_ENDED = obj({
    "version": {"const": 1, "type": "integer", "x-error": "unsupported sync record version (expected 1)"},
    "how": {"enum": ["undone", "aborted"]},
    "from_spec": SPEC, "to_spec": SPEC, "at": LINE,
    "tree_digest_before": SHA256,  # the tree before the sync's start
    "tree_digest": SHA256,         # the tree as the undo or abort left it
}, ["version", "how", "from_spec", "to_spec", "at", "tree_digest_before", "tree_digest"])

# ---------------------------------------------------------------- a release's manifest.json (`forktool package`)

_RELEASE_PATCH = {"type": "object", "required": ["id", "name", "sha256"],
                  "properties": {"id": PATCH_ID, "name": PATCH_NAME, "sha256": SHA256, "title": TEXT,
                                 "build_impact": LINE}}
# what `package verify` reads is checked strictly; build facts a later forktool may add are let through
RELEASE = {"type": "object", "required": ["format", "name", "files", "patches", "series_digest", "stamp", "upstream",
                                          "source_archive"],
           "properties": {
               "format": {"type": "integer", "minimum": 1, "maximum": 1000},
               "name": {**LINE, "minLength": 1},
               "files": {"type": "object", "minProperties": 1, "maxProperties": 1_000_000,
                         "propertyNames": REL_PATH, "additionalProperties": SHA256,
                         "x-error": "files must map each release path to its sha256"},
               "patches": {"type": "array", "items": _RELEASE_PATCH, "maxItems": 10_000},
               "series_digest": SHA256, "stamp": {**LINE, "minLength": 1},
               "build_number": COUNT, "top": {"anyOf": [{"type": "null"}, PATCH_ID]},
               "pristine_digest": SHA256, "registry_digest": {"anyOf": [{"type": "null"}, SHA256]},
               "source_date_epoch": {"type": "integer", "minimum": 0},
               "upstream": {"type": "object", "required": ["upstream_commit"],
                            "properties": {"upstream_commit": {"type": "string", "pattern": r"^([0-9a-f]{40})?\Z",
                                                               "x-error": "expected a commit id or ''"},
                                           "component": LINE, "package": LINE, "version": LINE,
                                           "sdist_sha256": {"type": "string", "maxLength": 64}}},
               "source_archive": obj({"file": {**REL_PATH, "maxLength": 300}, "prefix": {**LINE, "minLength": 1},
                                      "tree_digest": SHA256}, ["file", "prefix", "tree_digest"]),
               "build": {"type": "object"}, "profile": LINE,
           }}


SCHEMAS: dict[str, dict[str, Any]] = {
    name: {"$schema": DRAFT, **schema} for name, schema in {
        "vendor": VENDOR, "component-sdist": COMPONENT_SDIST, "component-git": COMPONENT_GIT,
        "component-tarball": COMPONENT_TARBALL, "component-dir": COMPONENT_DIR,
        "vendor-lock": VENDOR_LOCK, "registry": REGISTRY, "build": BUILD, "build-artifact": ARTIFACT,
        "build-profile": PROFILE, "build-record": BUILD_RECORD,
        "state": STATE, "journal": JOURNAL, "backup": BACKUP, "pristine": PRISTINE, "sync-state": SYNC_STATE,
        "sync-ended": SYNC_ENDED, "release": RELEASE,
    }.items()}

# the `next:` of a refusal by each schema, after the failing key's own x-hint (a caller's hint replaces both): a
# project file you edit names the file and the command that reads it again; a file forktool writes says how to
# replace it
_EDITED = {
    "vendor": ("vendor/vendor.yaml", "`forktool vendor status`"),
    **{f"component-{k}": ("vendor/vendor.yaml", "`forktool vendor status`") for k in KINDS},
    "registry": ("registry/UPSTREAM_SYNC.yaml", "`forktool registry check`"),
    **{name: ("registry/build.yaml", "`forktool build --plan`") for name in ("build", "build-artifact",
                                                                           "build-profile")},
}
_WRITTEN = {
    "vendor-lock": "restore vendor/vendor.lock from git, or delete it and run `forktool vendor fetch`",
    "build-record": "delete the build directory's record; the next `forktool build` rewrites it",
    "state": "restore the newest backup (`forktool backup restore NAME`), or, with the tree pristine, delete "
             ".opencoti/state.json",
    "journal": "run `forktool recover`; docs/safety.md says what it does with a damaged journal",
    "backup": "the backup is damaged; pick another one (`forktool backup list`)",
    "pristine": "delete the cached pristine manifest; `forktool vendor fetch` writes it again",
    "sync-state": "move .opencoti/sync/state.json away; docs/sync.md says how to put back what the sync changed",
    "sync-ended": "delete .opencoti/sync/ended.json; it only tells `forktool sync --undo` how the last sync ended",
    "release": "build the release again with `forktool package`",
}


def fix(name: str, part: str = "that key") -> str:
    """What to do about a refusal of the document checked by schema `name` (part: what to fix in a file you edit;
    the checks in code after the schema use it too)."""
    if name in _EDITED:
        file, again = _EDITED[name]
        return f"fix {part} in {file}; {again} re-checks it"
    return _WRITTEN[name]
