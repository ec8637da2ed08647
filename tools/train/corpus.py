#!/usr/bin/env python3
"""Build the training corpus from Debian 12's linux-doc-6.1 package (the Linux kernel's
Documentation/ tree, GPL-2.0; see tools/train/README.md).

  corpus.py [--src /usr/share/doc/linux-doc-6.1/Documentation] --out DIR

Reads every .rst (or .rst.gz) file, strips reStructuredText markup to plain prose (see
strip_rst), and writes DIR/train.txt, DIR/val.txt (UTF-8; documents separated by a blank
line) and DIR/manifest.json (file counts, byte counts, sha256). A document goes to the
validation split when crc32(relative path) % 50 == 0 (about 2 %, whole files, so no
validation text leaks into training). Deterministic: files are read in sorted order.
"""
import argparse, gzip, hashlib, json, os, re, sys, zlib

DROP_DIRECTIVES = {
    "toctree", "include", "literalinclude", "kernel-doc", "kernel-abi", "kernel-feat",
    "kernel-include", "image", "figure", "raw", "only", "index", "highlight", "contents",
    "sectionauthor", "maintainers-include", "kernel-figure", "kernel-render", "csv-table",
    "flat-table", "cssclass", "table", "tabularcolumns", "default-domain", "c:namespace",
    "c:namespace-push", "c:namespace-pop", "ifconfig", "glossary",
}
ADORN = re.compile(r"^\s*([=\-~^\"'`#*+_:.])\1{2,}\s*$")
DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([A-Za-z0-9:_-]+)::(.*)$")
COMMENT_OR_TARGET = re.compile(r"^(\s*)\.\.(\s|$)")
ROLE_WITH_TARGET = re.compile(r":[A-Za-z0-9:_-]+:`([^`<]*?)\s*<[^`>]*>`")
ROLE = re.compile(r":[A-Za-z0-9:_-]+:`([^`]*)`")
LITERAL = re.compile(r"``([^`]+)``")
LINK = re.compile(r"`([^`<]*?)\s*(<[^`>]*>)?`__?")
STRONG = re.compile(r"\*\*([^*]+)\*\*")
SUBST = re.compile(r"\|([A-Za-z0-9_ -]+)\|")


def indent_of(line):
    return len(line) - len(line.lstrip(" \t"))


def strip_rst(text):
    out = []
    lines = text.replace("\r\n", "\n").replace("\t", "        ").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = DIRECTIVE.match(line)
        if m or COMMENT_OR_TARGET.match(line):
            base = indent_of(line)
            name = m.group(2) if m else ""
            keep_body = bool(m) and name not in DROP_DIRECTIVES
            if m and keep_body and m.group(3).strip() and name in ("note", "warning", "attention",
                                                                      "hint", "important", "tip"):
                out.append(m.group(3).strip())
            i += 1
            # the directive's indented block: options (":opt:") are always dropped
            while i < len(lines) and (lines[i].strip() == "" or indent_of(lines[i]) > base):
                if lines[i].strip() == "" and (i + 1 >= len(lines) or
                                               (lines[i + 1].strip() and indent_of(lines[i + 1]) <= base)):
                    break
                if keep_body and not re.match(r"^\s*:[A-Za-z-]+:", lines[i]):
                    out.append(lines[i][base:] if len(lines[i]) > base else lines[i].strip())
                i += 1
            continue
        if ADORN.match(line):
            i += 1
            continue
        if line.strip().startswith("SPDX-License-Identifier"):
            i += 1
            continue
        line = ROLE_WITH_TARGET.sub(r"\1", line)
        line = ROLE.sub(r"\1", line)
        line = LITERAL.sub(r"\1", line)
        line = LINK.sub(r"\1", line)
        line = STRONG.sub(r"\1", line)
        line = SUBST.sub(r"\1", line)
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]          # "Example::" -> "Example:"
            if line.strip() == ":":
                i += 1
                continue
        out.append(line.rstrip())
        i += 1
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="/usr/share/doc/linux-doc-6.1/Documentation")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not os.path.isdir(a.src):
        sys.exit(f"corpus: no directory {a.src} (run scripts/setup-train.sh)")
    files = []
    for root, _, names in os.walk(a.src):
        for n in names:
            if n.endswith(".rst") or n.endswith(".rst.gz"):
                files.append(os.path.join(root, n))
    files.sort()
    split = {"train": [], "val": []}
    counts = {"train": 0, "val": 0}
    for f in files:
        rel = os.path.relpath(f, a.src)
        raw = gzip.open(f, "rb").read() if f.endswith(".gz") else open(f, "rb").read()
        txt = strip_rst(raw.decode("utf-8", errors="replace"))
        if len(txt) < 200:
            continue
        s = "val" if zlib.crc32(rel.removesuffix(".gz").encode()) % 50 == 0 else "train"
        split[s].append(txt)
        counts[s] += 1
    os.makedirs(a.out, exist_ok=True)
    man = {"source": a.src, "files_total": len(files)}
    for s in ("train", "val"):
        data = ("\n\n".join(split[s]) + "\n").encode("utf-8")
        with open(os.path.join(a.out, f"{s}.txt"), "wb") as fh:
            fh.write(data)
        man[s] = {"documents": counts[s], "bytes": len(data),
                  "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(a.out, "manifest.json"), "w") as fh:
        json.dump(man, fh, indent=1)
    print(json.dumps(man))


if __name__ == "__main__":
    main()
