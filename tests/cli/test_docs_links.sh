#!/usr/bin/env bash
# The documentation's links hold: in README.md and every docs/*.md, each relative Markdown
# link ([text](path), ![alt](path), [ref]: path; with an optional #anchor) names a file or
# directory that exists, relative to the Markdown file; an #anchor into a .md file (or a
# bare #anchor into the same file) matches one of its headings, by GitHub's rule (lowercase,
# spaces to '-', punctuation other than '-' and '_' dropped, -1, -2 ... for repeats).
# Links in code (fenced blocks, `spans`) and absolute URLs are not checked. Also: README.md
# is at most 250 lines, docs/library.md links tests/cmake-consumer/main.cpp, the tested
# library example, and, given the tool, docs/configs.md's key table lists exactly the keys
# `tinylm train --print-config` writes, with the same defaults and accepted values (the
# comment it writes after a key that has a rule or choices).
# Prints one "ok:" line per file and one "FAIL:" line per problem; exits 1 on any problem.
# usage: test_docs_links.sh SOURCE_DIR [TINYLM]
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 SOURCE_DIR [TINYLM]" >&2; exit 2; }
python=$(command -v python3 || true)
[ -n "$python" ] || { echo "skipped: python3 is not installed"; exit 77; }
exec "$python" - "$@" <<'PY'
import os, re, subprocess, sys, unicodedata, urllib.parse

root = os.path.realpath(sys.argv[1])
MAX_README_LINES = 250
problems = 0

def fail(msg):
    global problems
    problems += 1
    print(f"FAIL: {msg}")

def rel(path):
    return os.path.relpath(path, root)

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")

def outside_fences(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        yield number, line

def prose_lines(text):
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    for number, line in outside_fences(text):
        # Blank `code spans` (any number of backticks, matched pairs) keeping the width.
        yield number, re.sub(r"(`+)(.+?)\1", lambda s: " " * len(s.group(0)), line)

def slug(heading):
    text = heading.strip().rstrip("#").strip()
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)   # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                       # inline HTML
    text = text.replace("`", "").lower()
    out = []
    for ch in text:
        if ch == " ":
            out.append("-")
        elif ch in "-_" or unicodedata.category(ch)[0] in "LNM":
            out.append(ch)
    return "".join(out)

anchor_cache = {}

def anchors(md_path):
    if md_path not in anchor_cache:
        seen, found = {}, set()
        with open(md_path, encoding="utf-8") as f:
            text = f.read()
        for _, line in outside_fences(text):
            h = re.match(r"^ {0,3}#{1,6}\s+(.*)$", line)
            if not h:
                continue
            base = slug(h.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        anchor_cache[md_path] = found
    return anchor_cache[md_path]

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

def check_file(md):
    """Checks one Markdown file; returns (links checked, resolved targets)."""
    count, targets = 0, set()
    with open(md, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        found = [m.group(1) for m in INLINE.finditer(line)]
        m = REFERENCE.match(line)
        if m:
            found.append(m.group(1))
        for target in found:
            target = target.strip("<>")
            if SCHEME.match(target) or target.startswith("//"):
                continue  # an absolute URL: not checked here
            count += 1
            where = f"{rel(md)}:{number}: link '{target}'"
            path_part, _, anchor = target.partition("#")
            path_part = urllib.parse.unquote(path_part)
            if path_part:
                base = root if path_part.startswith("/") else os.path.dirname(md)
                resolved = os.path.normpath(os.path.join(base, path_part.lstrip("/")))
            else:
                resolved = md  # a bare #anchor: this file
            if not os.path.exists(resolved):
                fail(f"{where}: {rel(resolved)} does not exist")
                continue
            targets.add(os.path.realpath(resolved))
            if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
                anchor = urllib.parse.unquote(anchor)
                if anchor not in anchors(resolved):
                    fail(f"{where}: no heading in {rel(resolved)} has the anchor #{anchor}")
    return count, targets

readme = os.path.join(root, "README.md")
docs = os.path.join(root, "docs")
files = [readme]
if os.path.isdir(docs):
    files += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
for md in files:
    if not os.path.isfile(md):
        fail(f"{rel(md)} is missing")
        continue
    before = problems
    count, targets = check_file(md)
    notes = []
    if md == readme:
        with open(md, encoding="utf-8") as f:
            lines = f.read().count("\n")
        if lines > MAX_README_LINES:
            fail(f"README.md has {lines} lines, more than {MAX_README_LINES}: move detail into docs/")
        notes.append(f"{lines} lines")
    if rel(md) == os.path.join("docs", "library.md"):
        example = os.path.realpath(os.path.join(root, "tests", "cmake-consumer", "main.cpp"))
        if example not in targets:
            fail("docs/library.md does not link tests/cmake-consumer/main.cpp, the tested library example")
        else:
            notes.append("links tests/cmake-consumer/main.cpp")
    if problems == before:
        print(f"ok: {rel(md)}: {count} relative links hold" + "".join(f"; {n}" for n in notes))
if not os.path.isdir(docs):
    fail("docs/ is missing")

# The key table of docs/configs.md against the tool's own --print-config.
if len(sys.argv) > 2:
    # A config writes the keys its model and task kinds take: the defaults' first, then
    # those only the transformer and the tasks with data take (their defaults likewise).
    # (data has no default a task with data takes: its value here is ours, not compared.)
    tool, tool_accepts = {}, {}
    for extra in ([], ["--model", "transformer", "--task", "text", "--vocab-size", "256", "--data", "x"],
                  ["--model", "transformer", "--task", "tokens", "--data", "x"]):
        printed = subprocess.run([sys.argv[2], "train", "--print-config"] + extra, capture_output=True,
                                 text=True, check=True).stdout
        # key = value, and after it "  # what it accepts" where the key has a rule or choices.
        for k, v, a in re.findall(r"^([a-z0-9-]+) = (.*?)(?:  # (.*))?$", printed, re.M):
            if k not in tool:
                tool[k], tool_accepts[k] = v, a
    with open(os.path.join(docs, "configs.md"), encoding="utf-8") as f:
        rows = re.findall(r"^\| `([a-z0-9-]+)` \| [a-z]+ \| `([^`]*)` \| ([^|]*) \|", f.read(), re.M)
    table = {k: v for k, v, _ in rows}
    table_accepts = {k: a.strip() for k, _, a in rows}
    for key in sorted(set(tool) - set(table)):
        fail(f"docs/configs.md: the key table lacks '{key}' (tinylm train --print-config writes it)")
    for key in sorted(set(table) - set(tool)):
        fail(f"docs/configs.md: the key table lists '{key}', which tinylm train --print-config does not write")
    for key in sorted(set(tool) & set(table)):
        if tool[key] != table[key] and key != "data":
            fail(f"docs/configs.md: '{key}' defaults to {tool[key]}, not {table[key]}")
        if tool_accepts[key] != table_accepts[key]:
            fail(f"docs/configs.md: '{key}' accepts '{tool_accepts[key]}' (--print-config's comment), "
                 f"the table says '{table_accepts[key]}'")
    if set(tool) == set(table):
        print(f"ok: docs/configs.md: its key table lists the {len(tool)} keys --print-config writes, "
              "with their defaults and accepted values")
sys.exit(1 if problems else 0)
PY
