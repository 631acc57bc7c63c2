#!/usr/bin/env python3
"""MSRV check: the declared `rust-version` must be at least the highest
`rust-version` of the normal and build dependencies at the lowest versions
the workspace allows (what a user on the oldest toolchain can resolve to).

The requirements come from `cargo metadata`; the `rust-version` of each
lowest allowed version from the crates.io sparse index. Exits 1 when the
declared value is lower than the computed one.

Optional dependencies of the broker features may need more than the crate
does: each such dependency must be listed in NEEDS_MORE with the Rust it
needs (the README's "Minimum Rust" says the same), and the listed value
must be at least the computed one.
"""
import json
import subprocess
import sys
import urllib.request

# Optional dependencies that need a newer Rust than the crate itself: only
# users of their feature need it (README, "Minimum Rust").
NEEDS_MORE = {"lapin": "1.88", "async-nats": "1.89", "aws-sdk-sqs": "1.94.1"}


def parse(version):
    core = version.split("+")[0]
    if "-" in core:
        return None  # pre-releases are never the lowest allowed
    parts = [int(p) for p in core.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def bounds(requirement):
    """The (lowest, highest-exclusive) versions a cargo requirement allows."""
    low, high = (0, 0, 0), None
    for comparator in requirement.split(","):
        comparator = comparator.strip()
        for op in (">=", "<=", "=", ">", "<", "^", "~"):
            if comparator.startswith(op):
                break
        else:
            op = "^"
        text = comparator[len(op):].strip()
        if text in ("", "*"):
            continue
        given = len(text.split("."))
        version = parse(text)
        if op in ("^", "~", "=", ">="):
            low = max(low, version)
        if op == ">":
            low = max(low, version[:2] + (version[2] + 1,))
        if op == "<":
            high = version if high is None else min(high, version)
        if op == "=":
            top = version[:2] + (version[2] + 1,)
            high = top if high is None else min(high, top)
        if op == "^":
            major, minor, patch = version
            if major > 0 or given == 1:
                top = (major + 1, 0, 0)
            elif minor > 0 or given == 2:
                top = (0, minor + 1, 0)
            else:
                top = (0, 0, patch + 1)
            high = top if high is None else min(high, top)
        if op == "~":
            major, minor, _ = version
            top = (major + 1, 0, 0) if given == 1 else (major, minor + 1, 0)
            high = top if high is None else min(high, top)
    return low, high


def index_url(name):
    name = name.lower()
    if len(name) <= 2:
        path = f"{len(name)}/{name}"
    elif len(name) == 3:
        path = f"3/{name[0]}/{name}"
    else:
        path = f"{name[:2]}/{name[2:4]}/{name}"
    return f"https://index.crates.io/{path}"


def lowest_allowed(name, requirement):
    low, high = bounds(requirement)
    with urllib.request.urlopen(index_url(name), timeout=30) as response:
        entries = [json.loads(line) for line in response.read().decode().splitlines() if line]
    candidates = []
    for entry in entries:
        version = parse(entry["vers"])
        if version is None or entry.get("yanked") or version < low:
            continue
        if high is not None and version >= high:
            continue
        candidates.append((version, entry))
    if not candidates:
        sys.exit(f"msrv: no published version of {name} satisfies {requirement}")
    return min(candidates, key=lambda c: c[0])[1]


def main():
    metadata = json.loads(
        subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"])
    )
    members = metadata["packages"]
    declared = {p["rust_version"] for p in members}
    if len(declared) != 1 or None in declared:
        sys.exit(f"msrv: every package must declare one rust-version, found {declared}")
    declared = declared.pop()
    needed, rows = (0, 0, 0), []
    seen = set()
    for package in members:
        for dep in package["dependencies"]:
            if dep["kind"] == "dev" or dep.get("path"):
                continue  # dev-dependencies may need more; our own crates share the value
            key = (dep["name"], dep["req"])
            if key in seen:
                continue
            seen.add(key)
            entry = lowest_allowed(dep["name"], dep["req"])
            rust = entry.get("rust_version")
            rows.append((dep["name"], dep["req"], entry["vers"], rust or "-"))
            if rust and dep.get("optional") and dep["name"] in NEEDS_MORE:
                if parse(NEEDS_MORE[dep["name"]]) < parse(rust):
                    sys.exit(f"msrv: {dep['name']} needs Rust {rust}, NEEDS_MORE says {NEEDS_MORE[dep['name']]}")
                continue  # its feature's own minimum, documented
            if rust:
                needed = max(needed, parse(rust))
    width = max(len(r[0]) for r in rows)
    for name, requirement, version, rust in sorted(rows):
        print(f"  {name:<{width}}  {requirement:<18} lowest {version:<10} rust-version {rust}")
    needed_text = ".".join(str(p) for p in needed).removesuffix(".0")
    print(f"computed minimum: {needed_text}; declared: {declared}")
    for name, rust in sorted(NEEDS_MORE.items()):
        print(f"  feature dependency {name} needs Rust {rust}")
    # For the README: what the tests, benches and examples need as locked
    # (dev-dependencies included), which may be more.
    locked = json.loads(
        subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"])
    )
    newest = max(
        (parse(p["rust_version"]), p["name"], p["version"])
        for p in locked["packages"]
        if p.get("rust_version") and p["source"]
    )
    print(f"as locked, with dev-dependencies: {'.'.join(map(str, newest[0]))} ({newest[1]} {newest[2]})")
    if parse(declared) < needed:
        sys.exit(f"msrv: rust-version {declared} is lower than {needed_text}, which the dependencies need")


if __name__ == "__main__":
    main()
