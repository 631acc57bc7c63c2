#!/usr/bin/env python3
"""The runtime's layers: which module may use which.

Reads every `crate::<module>` and `super::` path in inbox-runtime/src (comments
and doc comments stripped), maps each file to its module, and fails when

- the modules' imports form a cycle,
- a module imports from a layer above its own (LAYERS, top first), or
- a library source file (inbox-runtime/src, inbox-macros/src, src) is
  longer than MAX_LINES: one file, one job (STYLE.md).

Run it from the repository root: `python3 .ci/layers.py` (CI does, in the
"Layers" step). `--graph` prints each module's imports.
"""
import os
import re
import sys

SRC = "inbox-runtime/src"

# The library's source folders, and the longest a file of them may be.
LIBRARY = ("inbox-runtime/src", "inbox-macros/src", "src")
MAX_LINES = 800

# Top first. A module imports only from layers below its own, and, within
# its layer, from the modules listed after it.
LAYERS = [
    ("facade", ("lib", "__private", "__facade", "__testing")),
    ("operations", (
        "overview",
        "outbox", "outbox::message", "outbox::operations", "outbox::groups", "outbox::dead",
        "outbox::failures", "outbox::wal",
        "outbox::relay",
        "outbox::notify",
        "outbox::statements", "outbox::headers", "outbox::id",
        "ops", "ops::durability", "ops::entries", "ops::positions", "ops::purge", "ops::transaction",
        "migrate",
    )),
    ("drivers", ("inbox", "inbox::modes", "asynchronous", "transaction")),
    ("engine", ("options", "claim", "engine", "retry", "registry", "observe", "telemetry", "recent")),
    ("backends", (
        "backend::postgres::connection", "backend::postgres", "backend::postgres::claim",
        "backend::mysql", "backend::sqlite",
        "backend::execute", "backend::asynchronous", "backend::transaction", "backend::outbox",
        "backend::overview", "backend::outbox_claim", "backend::outbox_wal",
        "backend::positions", "backend::stmt", "backend::statements", "backend", "backend::shape",
    )),
    ("ground", (
        "prerequisite", "error", "handler", "key", "fingerprint", "processed", "schema", "rows", "wake", "fence",
        "backoff", "otel", "target",
        "backend::errors",
    )),
]


def module_of(path):
    rel = os.path.relpath(path, SRC)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    if parts == ["private"]:
        return "__private"
    if parts in (["facade"], ["testing"]):
        return "__" + parts[0]
    return "::".join(parts)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def root_exports():
    """Names the crate root re-exports (`pub use module::{A, b}`), to the
    module that defines them: `crate::InboxError` is an import of `error`."""
    text = strip_comments(open(os.path.join(SRC, "lib.rs"), encoding="utf-8").read())
    names = {}
    for module, body in re.findall(r"pub use ([a-z_][a-z0-9_]*)::\{([^}]*)\}", text):
        for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", body):
            names[name] = module
    for module, name in re.findall(r"pub use ([a-z_][a-z0-9_]*)::([A-Za-z_][A-Za-z0-9_]*);", text):
        names[name] = module
    return names


def imports(path, module):
    text = strip_comments(open(path, encoding="utf-8").read())
    found = set()
    exports = root_exports()
    # `use crate::{a, b::c}` and `crate::a::b` in paths.
    for group in re.findall(r"crate::\{([^}]*)\}", text):
        for name in re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)?)", group):
            found.add(name if name in ALL else name.split("::")[0])
    for first, second in re.findall(r"crate::([A-Za-z_][A-Za-z0-9_]*)(?:::([a-z_][a-z0-9_]*))?", text):
        nested = f"{first}::{second}"
        found.add(nested if second and nested in ALL else exports.get(first, first))
    for group in re.findall(r"crate::\{([^}]*)\}", text):
        for name in re.findall(r"(?:^|,)\s*([A-Z][A-Za-z0-9_]*)", group):
            found.add(exports.get(name, name))
    # `super::` on an unindented line is the parent module; indented, it is
    # an inline module's (`mod tests`, `mod asynchronous`) way to name this
    # file's own items.
    parent = module.rsplit("::", 1)[0] if "::" in module else "lib"
    top = "\n".join(line for line in text.splitlines() if not line[:1].isspace())
    for name in re.findall(r"super::([a-z_][a-z0-9_]*)", top):
        found.add(f"{parent}::{name}" if f"{parent}::{name}" in ALL else parent)
    if re.search(r"\bsuper::(\{|[A-Z*])", top):
        found.add(parent)
    resolved = set()
    for name in found:
        if "::" in name and name in ALL:
            resolved.add(name)
            continue
        head = name.split("::")[0]
        if f"backend::{head}" in ALL and module.startswith("backend") and "::" in name:
            resolved.add(f"backend::{head}")
        elif head in ALL:
            resolved.add(head)
        elif name in ALL:
            resolved.add(name)
    resolved.discard(module)
    # Test modules (`mod tests`) may reach anywhere: strip them first.
    return resolved


def files():
    """The runtime's modules, but unit-test files (`tests.rs`, a module
    `#[cfg(test)] mod tests;`), which may reach anywhere."""
    for root, _, names in os.walk(SRC):
        for name in names:
            if name.endswith(".rs") and name != "tests.rs":
                yield os.path.join(root, name)


def oversized():
    """The library's source files longer than MAX_LINES."""
    for folder in LIBRARY:
        for root, _, names in os.walk(folder):
            for name in sorted(names):
                if name.endswith(".rs"):
                    path = os.path.join(root, name)
                    with open(path, encoding="utf-8") as f:
                        count = sum(1 for _ in f)
                    if count > MAX_LINES:
                        yield path, count


def without_tests(path):
    """The file without its `#[cfg(test)] mod tests { .. }` block (brace
    matched), which may reach anywhere."""
    text = open(path, encoding="utf-8").read()
    match = re.search(r"#\[cfg\((?:all\()?test[^\]]*\]\s*mod tests\s*\{", text)
    if not match:
        return text
    depth, i = 1, match.end()
    while depth and i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[: match.start()] + text[i:]


ALL = set()


def main():
    paths = sorted(files())
    for p in paths:
        ALL.add(module_of(p))
    rank = {}
    order = {}
    for depth, (_, modules) in enumerate(LAYERS):
        for i, m in enumerate(modules):
            rank[m] = depth
            order[m] = i
    graph = {}
    for p in paths:
        m = module_of(p)
        text = without_tests(p)
        tmp = p + ".layers-tmp"
        graph[m] = set()
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            graph[m] = imports(tmp, m)
        finally:
            os.remove(tmp)
    if "--graph" in sys.argv:
        for m in sorted(graph):
            print(f"{m}: {', '.join(sorted(graph[m]))}")
    problems = []
    unknown = sorted(m for m in graph if m not in rank)
    for m in unknown:
        problems.append(f"{m}: not in any layer of .ci/layers.py")
    for m, deps in sorted(graph.items()):
        if m not in rank:
            continue
        for d in sorted(deps):
            if d not in rank:
                continue
            if rank[d] < rank[m]:
                problems.append(f"{m} ({LAYERS[rank[m]][0]}) imports {d} ({LAYERS[rank[d]][0]}), a layer above it")
            elif rank[d] == rank[m] and order[d] <= order[m] and m != "lib":
                problems.append(f"{m} imports {d}: same layer ({LAYERS[rank[m]][0]}), listed before it")
    # Cycles (Tarjan).
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    for comp in cycles:
        problems.append(f"import cycle of {len(comp)} modules: {', '.join(comp)}")
    for path, count in oversized():
        problems.append(f"{path}: {count} lines, over {MAX_LINES}: split it by job")
    if problems:
        print("layers: FAILED")
        for p in problems:
            print("  " + p)
        return 1
    print(
        f"layers: {len(graph)} modules in {len(LAYERS)} layers, no cycle, no upward import; "
        f"no library file over {MAX_LINES} lines"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
