#!/usr/bin/env python3
"""Gives a clean clone's unchanged files the times they had in the last run.

Cargo decides that a crate of the workspace needs rebuilding when one of its
source files is newer than the build's output. A fresh clone gives every
file the clock time of the clone, so a build cache kept outside the clone
would rebuild every crate of the workspace on every run. This script keeps,
beside the cache, each tracked file's content id (git's blob id of the file
as it is on disk) and the time it was given when a run last saw that
content.

    python3 .ci/mtimes.py start <record>   before the run's first build
    python3 .ci/mtimes.py end <record>     when the run ends, passed or not

`start`: a file whose content is the recorded one gets the recorded time
back (older than the outputs built from it since); every other file gets the
current time (newer than every output in the cache), and is recorded with
it. So cargo rebuilds the crates whose files changed, and nothing else:
content decides, never a time alone.

`end`: forgets every file whose content or time is no longer what `start`
left (edited, checked out or touched during the run): what the run built
from it is not known, so the next run treats it as changed. A run that
never reached `end` (killed) leaves its record open, and the next `start`
forgets the whole record: every file counts as changed once.

The record also names the clone's directory. A run from another directory
forgets the whole record too: the workspace's crates bake their own
directory in (`env!("CARGO_MANIFEST_DIR")`, which a test uses to find
`scripts/`), and cargo does not rebuild them when only the directory
changed, so a test built in one clone would run another clone's scripts.
"""

import json
import os
import subprocess
import sys
import time


def contents():
    """Path -> blob id of each tracked regular file, as it is on disk."""
    listing = subprocess.run(
        ["git", "ls-files", "-s", "-z"], check=True, capture_output=True
    ).stdout.decode()
    paths = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        # Regular files (not links or submodules), present on disk.
        if meta.startswith("100") and os.path.isfile(path) and not os.path.islink(path):
            paths.append(path)
    if not paths:
        return {}
    blobs = subprocess.run(
        ["git", "hash-object", "--no-filters", "--stdin-paths"],
        input="\n".join(paths) + "\n",
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return dict(zip(paths, blobs))


def clone_dir():
    """The clone's directory, as cargo sees it (symbolic links resolved)."""
    return os.path.realpath(os.getcwd())


def load(record_path):
    """(whether a run left it open, the clone's directory, path -> [blob, time])."""
    try:
        with open(record_path) as f:
            saved = json.load(f)
        return bool(saved["open"]), saved.get("dir"), dict(saved["files"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False, None, {}


def save(record_path, is_open, record):
    os.makedirs(os.path.dirname(record_path) or ".", exist_ok=True)
    with open(record_path + ".tmp", "w") as f:
        json.dump({"open": is_open, "dir": clone_dir(), "files": record}, f)
    os.replace(record_path + ".tmp", record_path)


def start(record_path):
    was_open, last_dir, record = load(record_path)
    if was_open:
        print("the last run did not end (killed?): every file counts as changed")
        record = {}
    elif record and last_dir != clone_dir():
        print(f"the last run was in {last_dir}, this one in {clone_dir()}: every file counts as changed")
        record = {}
    now = time.time_ns()
    restored = 0
    blobs = contents()
    for path, blob in blobs.items():
        seen = record.get(path)
        if seen and seen[0] == blob:
            stamp = seen[1]
            restored += 1
        else:
            stamp = now
            record[path] = [blob, stamp]
        os.utime(path, ns=(stamp, stamp))
    for path in [p for p in record if p not in blobs]:
        del record[path]
    save(record_path, True, record)
    print(f"{restored} of {len(blobs)} files unchanged since the last run kept their times")


def end(record_path):
    _, last_dir, record = load(record_path)
    if last_dir != clone_dir():
        record = {}
    blobs = contents()
    forgotten = []
    for path, (blob, stamp) in list(record.items()):
        try:
            same = blobs.get(path) == blob and os.stat(path).st_mtime_ns == stamp
        except OSError:
            same = False
        if not same:
            del record[path]
            forgotten.append(path)
    save(record_path, False, record)
    if forgotten:
        print(f"{len(forgotten)} files changed during the run; the next run rebuilds from them: "
              + ", ".join(forgotten[:10]))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "end"):
        sys.exit("usage: mtimes.py start|end <record>")
    {"start": start, "end": end}[sys.argv[1]](sys.argv[2])
